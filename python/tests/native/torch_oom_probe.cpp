// Loads libmrstack_c.so, makes the torch allocation entry point refuse, and prints the
// dynamic type and message of what it throws: c10::OutOfMemoryError once bound to a
// libc10.so (argv[2]), mrstack::out_of_memory otherwise. Then shows the stack still serves.
#include <cstdio>
#include <cstring>
#include <exception>
#include <typeinfo>

#include <dlfcn.h>

int main(int argc, char** argv) {
  if (argc < 2) { return 2; }
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (lib == nullptr) { std::printf("dlopen: %s\n", dlerror()); return 2; }
  auto configure = reinterpret_cast<int (*)(char const*)>(dlsym(lib, "mrstack_configure"));
  auto bind = reinterpret_cast<int (*)(char const*)>(dlsym(lib, "mrstack_torch_bind_c10"));
  auto alloc = reinterpret_cast<void* (*)(std::size_t, int, void*)>(dlsym(lib, "mrstack_torch_alloc_raising"));
  auto release = reinterpret_cast<void (*)(void*, std::size_t, int, void*)>(dlsym(lib, "mrstack_torch_free"));
  if (configure("limiting(limit=1MiB) > pool(initial=4MiB) > simulated") != 0) { return 3; }
  if (argc > 2) { std::printf("bind %d\n", bind(argv[2])); }
  void* kept = alloc(512 << 10, 0, nullptr);
  try {
    (void)alloc(1 << 20, 0, nullptr);
    std::printf("no exception\n");
  } catch (std::exception const& e) {
    std::printf("type %s\nwhat %s\n", typeid(e).name(), e.what());
  }
  void* again = alloc(256 << 10, 0, nullptr);  // still serves
  std::printf("served again %d\n", again != nullptr);
  release(again, 256 << 10, 0, nullptr);
  release(kept, 512 << 10, 0, nullptr);
  return 0;
}
