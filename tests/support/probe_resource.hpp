#pragma once
// A pass-through layer that remembers the arguments it was built with. The spec tests
// register it under names of their own, so the builder can be tested on every parameter
// type without other resources' rules in the way.
#include <mrstack/resource.hpp>
#include <mrstack/spec_registry.hpp>

#include <string>
#include <utility>

namespace mrstack::test {

struct probe_resource final : memory_resource {
  probe_resource(std::string name, resource_ptr up, spec_arguments a)
      : name_{std::move(name)}, upstream_{std::move(up)}, args{std::move(a)} {}
  std::string name_;
  resource_ptr upstream_;
  spec_arguments args;
  void* do_allocate(std::size_t b, std::size_t al, stream_view s) override { return upstream_->allocate(b, s, al); }
  void do_deallocate(void* p, std::size_t b, std::size_t al, stream_view s) override { upstream_->deallocate(p, b, s, al); }
  std::string do_name() const override { return name_; }
  memory_resource* do_upstream() const noexcept override { return upstream_.get(); }
};

}  // namespace mrstack::test
