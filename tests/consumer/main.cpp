// Links against the installed mrstack and uses a resource that needs no GPU.
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <cstdio>

int main() {
  mrstack::simulated_memory_resource sim;
  void* p = sim.allocate(1000);
  bool const ok = p != nullptr && sim.footprint() == 1024;
  sim.deallocate(p, 1000);
  std::printf("consumer: %s\n", ok ? "ok" : "unexpected footprint");
  return ok ? 0 : 1;
}
