// Every resource a stack spec can name: one entry each (name, summary, whether it sits on
// an upstream, its parameters, how to build it). docs/spec.md lists the same table for
// people; keep the two together when adding an entry.
#include <mrstack/replay/footprint_meter.hpp>
#include <mrstack/spec_registry.hpp>
#include <mrstack/upstream/cuda_async_memory_resource.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>
#include <mrstack/upstream/managed_memory_resource.hpp>
#include <mrstack/upstream/pinned_host_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <limits>

#include "spec_detail.hpp"

namespace mrstack::detail {

std::vector<spec_resource> builtin_resources() {
  std::vector<spec_resource> r;

  // ---- upstreams (bottom resources) ---------------------------------------------------
  r.push_back({"cuda", "device memory from cudaMalloc/cudaFree (synchronous)", bottom_resource, {},
               [](spec_arguments const&, resource_ptr) -> resource_ptr {
                 return std::make_shared<cuda_memory_resource>();
               },
               });
  r.push_back({"cuda_async", "the driver's stream-ordered pool (cudaMallocFromPoolAsync) over a pool of its own",
               bottom_resource,
               {size_param("initial", optional_param, "bytes allocated and freed once at construction (a warm pool)", "0"),
                size_param("release_threshold", optional_param,
                           "bytes the pool keeps when the device synchronizes; the rest goes back", "keep everything")},
               [](spec_arguments const& a, resource_ptr) -> resource_ptr {
                 return std::make_shared<cuda_async_memory_resource>(a.size("initial").value_or(0),
                                                                     a.size("release_threshold"));
               },
               });
  r.push_back({"managed", "unified memory from cudaMallocManaged", bottom_resource, {},
               [](spec_arguments const&, resource_ptr) -> resource_ptr {
                 return std::make_shared<managed_memory_resource>();
               },
               });
  r.push_back({"pinned_host", "page-locked host memory from cudaHostAlloc", bottom_resource, {},
               [](spec_arguments const&, resource_ptr) -> resource_ptr {
                 return std::make_shared<pinned_host_memory_resource>();
               }});
  r.push_back({"system", "ordinary host memory (aligned operator new); for tests without a GPU", bottom_resource, {},
               [](spec_arguments const&, resource_ptr) -> resource_ptr {
                 return std::make_shared<system_memory_resource>();
               }});
  r.push_back({"simulated", "fake addresses, no memory touched; counts footprint, checks frees", bottom_resource,
               {size_param("capacity", optional_param, "refuse past this many bytes, like a full device; "
                                                       "percentages in the stack are shares of it", "unlimited")},
               [](spec_arguments const& a, resource_ptr) -> resource_ptr {
                 return std::make_shared<simulated_memory_resource>(
                     a.size("capacity").value_or(std::numeric_limits<std::size_t>::max()));
               },
               "capacity", "", true});

  // ---- measuring ----------------------------------------------------------------------
  r.push_back({"footprint_meter", "counts the bytes held from the layer below and their peak (mrstack-replay "
                                  "puts it above the bottom)",
               needs_upstream, {},
               [](spec_arguments const&, resource_ptr up) -> resource_ptr {
                 return std::make_shared<footprint_meter>(std::move(up));
               }});

  return r;
}

}  // namespace mrstack::detail
