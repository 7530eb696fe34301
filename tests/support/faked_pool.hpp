#pragma once
// A pool over `simulated` whose CUDA events go to a recording fake, and two created
// streams: the setup of the pool tests that count event records.
#include <fake_stream_sync.hpp>

#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>

#include <memory>
#include <optional>

namespace mrstack::test {

struct faked_pool {
  explicit faked_pool(pool_options options = {})
      : fake{std::make_shared<fake_stream_sync>()},
        pool{std::make_shared<simulated_memory_resource>(), 0, std::nullopt, with_fake(std::move(options), fake)} {}

  std::shared_ptr<fake_stream_sync> fake;
  pool_memory_resource pool;
  stream_view const a{reinterpret_cast<cudaStream_t>(0x100)};
  stream_view const b{reinterpret_cast<cudaStream_t>(0x200)};

 private:
  static pool_options with_fake(pool_options options, std::shared_ptr<fake_stream_sync> const& fake) {
    options.stream_sync = fake;
    return options;
  }
};

}  // namespace mrstack::test
