// Every resource a stack spec can name: one entry each (name, summary, whether it sits on
// an upstream, its parameters, how to build it). docs/spec.md lists the same table for
// people; keep the two together when adding an entry.
#include <mrstack/adaptor/aligned_resource_adaptor.hpp>
#include <mrstack/adaptor/failure_callback_resource_adaptor.hpp>
#include <mrstack/adaptor/limiting_resource_adaptor.hpp>
#include <mrstack/adaptor/logging_resource_adaptor.hpp>
#include <mrstack/adaptor/statistics_resource_adaptor.hpp>
#include <mrstack/adaptor/thread_safe_resource_adaptor.hpp>
#include <mrstack/adaptor/tracking_resource_adaptor.hpp>
#include <mrstack/replay/footprint_meter.hpp>
#include <mrstack/spec_registry.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/suballoc/binning_memory_resource.hpp>
#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/cuda_async_memory_resource.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>
#include <mrstack/upstream/managed_memory_resource.hpp>
#include <mrstack/upstream/pinned_host_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>
#include <mrstack/upstream/vmm_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <limits>

#include "device_scope.hpp"
#include "spec/spec_detail.hpp"

namespace mrstack::detail {

namespace {

// The sane bounds of parameters (docs/spec.md lists them). A value outside can never be
// served or would overflow the arithmetic below it, so the builder refuses it up front.
constexpr std::uint64_t KiB = std::uint64_t{1} << 10;
constexpr std::uint64_t MiB = std::uint64_t{1} << 20;
constexpr std::uint64_t GiB = std::uint64_t{1} << 30;
constexpr std::uint64_t TiB = std::uint64_t{1} << 40;
/// No device or host has more memory than this (x86-64 and ARM user address spaces are
/// 2^47–2^48 bytes): a larger reservation or arena can never be backed.
constexpr std::uint64_t max_memory = 256 * TiB;
/// A pool chunk holds at most 1 TiB (block_pool::max_chunk_size); the initial chunk and
/// every growth are rounded up to the growth granularity (at most 1 GiB), so 512 GiB
/// always fits.
constexpr std::uint64_t max_pool_chunk_request = 512 * GiB;
/// Blocks and bins past 1 GiB make chunks of at least 128 GiB (fixed_size and binning
/// take at least 128 blocks at a time from below): use a pool for sizes that large.
constexpr std::uint64_t max_block = GiB;
/// Device ordinals are ints (-1 means "the current device"): an unbounded count would be
/// cast to another device (2^32 to device 0, 2^32 - 1 to the current one). The bound is
/// the devices mrstack serves (device_scope.hpp), so a spec the checker passes builds.
constexpr std::uint64_t max_device = detail::max_devices - 1;

std::string bytes_text(std::uint64_t bytes) { return size_in_spec_units(bytes); }

void validate_pool(spec_arguments const& a) {
  auto const max = a.size("max");
  if (max && a.size("initial").value_or(0) > *max) {
    throw spec_parameter_error(std::vector<std::string>{"initial", "max"},
                               "initial " + bytes_text(*a.size("initial")) + " exceeds max " + bytes_text(*max));
  }
}

void validate_fixed_size(spec_arguments const& a) {
  std::uint64_t const block = (a.size("block_size").value_or(fixed_size_memory_resource::default_block_size) + 255) /
                              256 * 256;
  std::uint64_t const blocks =
      a.count("blocks_to_preallocate").value_or(fixed_size_memory_resource::default_blocks_to_preallocate);
  if (block * blocks > TiB) {  // both are bounded by their ranges: no overflow
    throw spec_parameter_error(std::vector<std::string>{"blocks_to_preallocate", "block_size"},
                               std::to_string(blocks) + " blocks of " + bytes_text(block) + " make a chunk of more than 1TiB");
  }
}

void validate_binning(spec_arguments const& a) {
  if (!a.has("max") || !a.has("min")) { return; }  // a percentage, unresolved while only checking
  if (*a.size("max") < *a.size("min")) {
    throw spec_parameter_error(std::vector<std::string>{"max", "min"},
                               "max " + bytes_text(*a.size("max")) + " is below min " + bytes_text(*a.size("min")));
  }
}

void validate_vmm(spec_arguments const& a) {
  try {
    (void)vmm_memory_resource::parse_ipc_mode(a.text("ipc").value_or("auto"));
  } catch (logic_error const&) {
    // Checked with the spec, not first when the stack is built (and never under --simulate).
    throw spec_parameter_error("ipc", "ipc=" + *a.text("ipc") + " is none of auto, none, fd, fabric");
  }
}

void validate_arena(spec_arguments const& a) {
  arena_options const defaults;
  std::uint64_t const superblock = a.size("superblock_size").value_or(defaults.superblock_size);
  std::uint64_t const small = a.size("max_small_size").value_or(defaults.max_small_size);
  if (small % 256 != 0 || small > superblock / 2) {
    throw spec_parameter_error(std::vector<std::string>{"max_small_size", "superblock_size"},
                               "max_small_size " + bytes_text(small) +
                                   " must be a multiple of 256B and at most half the superblock (" + bytes_text(superblock) + ")");
  }
}

void validate_simulated_vmm(spec_arguments const& a) {
  if (a.is_unresolved("reserve") || a.is_unresolved("granularity")) { return; }  // checked once resolved
  std::uint64_t const granularity = a.size("granularity").value_or(simulated_vmm_memory_resource::default_granularity);
  std::uint64_t const reserve = a.size("reserve").value_or(simulated_vmm_memory_resource::default_reserve);
  std::uint64_t const granules = (reserve + granularity - 1) / granularity;  // both bounded by their ranges
  if (granules > simulated_vmm_memory_resource::max_granules) {
    // The constructor refused it; checked here so check_stack_spec refuses it too.
    throw spec_parameter_error(std::vector<std::string>{"reserve", "granularity"},
                               "reserve " + bytes_text(reserve) + " is " + std::to_string(granules) + " granules of " +
                                   bytes_text(granularity) + ", more than the " +
                                   std::to_string(simulated_vmm_memory_resource::max_granules) +
                                   " it keeps books for: reserve at most " +
                                   bytes_text(simulated_vmm_memory_resource::max_granules * granularity) +
                                   ", or a larger granularity");
  }
}

void validate_logging(spec_arguments const& a) {
  // The constructor's rules, with binary's implied async and per_thread, so that
  // check_stack_spec refuses what building always would.
  bool const binary = a.flag("binary").value_or(false);
  bool const async = a.flag("async").value_or(binary);
  bool const per_thread = a.flag("per_thread").value_or(binary);
  if (binary && !per_thread) {
    throw spec_parameter_error(std::vector<std::string>{"per_thread", "binary"},
                               "binary records are written in per-thread order: per_thread=false cannot go with binary");
  }
  if (binary && !async) {
    throw spec_parameter_error(std::vector<std::string>{"async", "binary"},
                               "binary records are written on a background thread: async=false cannot go with binary");
  }
  if (per_thread && !async) {
    throw spec_parameter_error(std::vector<std::string>{"async", "per_thread"},
                               "per-thread order is a way of writing asynchronously: per_thread needs async");
  }
  // A synchronous log has no queue: the capacity would be taken and ignored.
  if (!async && a.count("queue_capacity").has_value()) {
    throw spec_parameter_error(std::vector<std::string>{"async", "queue_capacity"},
                               "queue_capacity sizes the asynchronous queues: it needs async (or binary)");
  }
}

}  // namespace

// long function: one table of every resource and parameter, read top to bottom like the
// --list-resources output it produces; split, it would scatter one list over many screens.
std::vector<spec_resource> builtin_resources() {
  std::vector<spec_resource> r;

  // ---- upstreams (bottom resources) ---------------------------------------------------
  r.push_back({"cuda", "device memory from cudaMalloc/cudaFree (synchronous)", bottom_resource,
               {count_param("device", optional_param, "the device ordinal", "the device the stack is built for")
                    .within(0, max_device),
                flag_param("peer_access", optional_param,
                           "let every peer device read and write this memory (cudaDeviceEnablePeerAccess)", "false")},
               [](spec_arguments const& a, resource_ptr) -> resource_ptr {
                 auto const device = a.count("device");
                 return std::make_shared<cuda_memory_resource>(device ? static_cast<int>(*device) : -1,
                                                               a.flag("peer_access").value_or(false));
               },
               });
  r.push_back({"cuda_async", "the driver's stream-ordered pool (cudaMallocFromPoolAsync) over a pool of its own",
               bottom_resource,
               {size_param("initial", optional_param, "bytes allocated and freed once at construction (a warm pool)", "0")
                    .within(0, max_memory),
                size_param("release_threshold", optional_param,
                           "bytes the pool keeps when the device synchronizes; the rest goes back", "keep everything"),
                count_param("device", optional_param, "the device ordinal", "the device the stack is built for")
                    .within(0, max_device),
                flag_param("peer_access", optional_param,
                           "let every peer device read and write the pool's memory (cudaMemPoolSetAccess)", "false")},
               [](spec_arguments const& a, resource_ptr) -> resource_ptr {
                 auto const device = a.count("device");
                 return std::make_shared<cuda_async_memory_resource>(a.size("initial").value_or(0),
                                                                     a.size("release_threshold"),
                                                                     device ? static_cast<int>(*device) : -1,
                                                                     a.flag("peer_access").value_or(false));
               },
               {}, {}, false, true});
  r.push_back({"managed", "unified memory from cudaMallocManaged", bottom_resource,
               {count_param("device", optional_param, "the device ordinal", "the device the stack is built for")
                    .within(0, max_device)},
               [](spec_arguments const& a, resource_ptr) -> resource_ptr {
                 auto const device = a.count("device");
                 return std::make_shared<managed_memory_resource>(device ? static_cast<int>(*device) : -1);
               },
               });
  r.push_back({"pinned_host", "page-locked host memory from cudaHostAlloc", bottom_resource,
               {count_param("device", optional_param, "the device whose context the calls use",
                            "the device the stack is built for")
                    .within(0, max_device)},
               [](spec_arguments const& a, resource_ptr) -> resource_ptr {
                 auto const device = a.count("device");
                 return std::make_shared<pinned_host_memory_resource>(device ? static_cast<int>(*device) : -1);
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
  r.push_back({"vmm", "one reserved virtual range per device, physical memory mapped on demand (cuMemCreate/Map); "
                      "a pool above it grows in place",
               bottom_resource,
               {size_param("reserve", optional_param, "addresses to reserve (cost no memory)", "twice the device's memory")
                    .within(0, max_memory),
                count_param("map_granules", optional_param, "granules per physical allocation (1: exact release)", "16")
                    .within(1, MiB),
                count_param("device", optional_param, "the device ordinal", "the current device").within(0, max_device),
                text_param("ipc", optional_param, "what memory can be exported as for IPC: fd, fabric, none, auto",
                           "auto (fd where supported)"),
                flag_param("peer_access", optional_param,
                           "let every peer device read and write this memory (cuMemSetAccess)", "true")},
               [](spec_arguments const& a, resource_ptr) -> resource_ptr {
                 auto const device = a.count("device");
                 return std::make_shared<vmm_memory_resource>(
                     a.size("reserve").value_or(0),
                     a.count("map_granules").value_or(vmm_memory_resource::default_map_granules),
                     device ? static_cast<int>(*device) : detail::resolve_device(-1),  // the stack's device
                     vmm_memory_resource::parse_ipc_mode(a.text("ipc").value_or("auto")),
                     a.flag("peer_access").value_or(true));
               },
               {}, "simulated_vmm", false, true});
  r.back().validate = validate_vmm;
  r.push_back({"simulated_vmm", "the CPU twin of vmm: the same granule bookkeeping over fake addresses", bottom_resource,
               {size_param("capacity", optional_param, "physical memory of the simulated device", "unlimited"),
                size_param("reserve", optional_param, "addresses to reserve", "1TiB").within(1, max_memory),
                size_param("granularity", optional_param, "the granule", "2MiB").within(256, GiB).power_of_two(),
                count_param("map_granules", optional_param, "granules per physical allocation", "16").within(1, MiB)},
               [](spec_arguments const& a, resource_ptr) -> resource_ptr {
                 return std::make_shared<simulated_vmm_memory_resource>(
                     a.size("reserve").value_or(simulated_vmm_memory_resource::default_reserve),
                     a.size("granularity").value_or(simulated_vmm_memory_resource::default_granularity),
                     a.size("capacity").value_or(std::numeric_limits<std::size_t>::max()),
                     a.count("map_granules").value_or(simulated_vmm_memory_resource::default_map_granules));
               },
               "capacity", "", true, true});
  r.back().validate = validate_simulated_vmm;

  // ---- suballocators --------------------------------------------------------------------
  r.push_back({"pool", "coalescing, stream-ordered suballocator (two-level segregated fit); grows by chunks",
               needs_upstream,
               {size_param("initial", optional_param, "bytes taken from the upstream at construction (one chunk)", "0")
                    .within(0, max_pool_chunk_request),
                size_param("max", optional_param, "the most bytes it may hold", "unbounded").within(256, max_memory),
                count_param("growth_divisor", optional_param, "a new chunk is at least pool size / this", "12")
                    .within(1, 1024),
                size_param("minimum_growth", optional_param, "a new chunk is at least this", "4MiB")
                    .within(0, max_pool_chunk_request),
                size_param("growth_granularity", optional_param, "chunk sizes are rounded up to this", "2MiB")
                    .within(256, GiB)
                    .power_of_two(),
                flag_param("consolidate_on_growth", optional_param,
                           "return wholly free chunks and take their bytes back in the new one", "true"),
                flag_param("grow_in_place", optional_param,
                           "over vmm/simulated_vmm: one chunk grown in place, free granules given back", "true"),
                size_param("release_threshold", optional_param,
                           "growing in place: give free granules back when more than this is free",
                           "only on release() and when the device is full"),
                flag_param("eager_events", optional_param,
                           "with several streams, record an event at every free on a created stream (RMM's rule) "
                           "instead of when another stream wants the memory",
                           "false"),
                count_param("park_divisor", optional_param,
                            "with several streams, a stream records and parks after freeing 1/this of the pool "
                            "(smaller: fewer CUDA events, more memory other streams must ask for)",
                            "1024")
                    .within(1, 1U << 20),
                size_param("park_minimum", optional_param,
                           "... but not before it has freed this much (each record is a CUDA call)", "8MiB")
                    .within(0, TiB),
                count_param("contention_window", optional_param,
                            "with several streams, frees park before anyone asks only within this many frees "
                            "of a stream asking another for memory or the pool growing (0: always)",
                            "0")
                    .within(0, 1U << 30),
                count_param("thread_shards", optional_param,
                            "once threads contend for it, each allocates from its own shard (threads beyond "
                            "share them); 0: one lock for all",
                            "64")
                    .within(0, 64),
                count_param("shard_after_contentions", optional_param,
                            "shard once callers found the lock taken this many times (0: from the second "
                            "calling thread on)",
                            "256")
                    .within(0, 1U << 30),
                size_param("shard_block_limit", optional_param, "larger requests bypass the thread shards", "1MiB")
                    .within(256, max_pool_chunk_request)},
               [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                 pool_options o;
                 o.thread_shards = a.count("thread_shards").value_or(o.thread_shards);
                 o.park_divisor = a.count("park_divisor").value_or(o.park_divisor);
                 o.park_minimum = a.size("park_minimum").value_or(o.park_minimum);
                 o.contention_window = a.count("contention_window").value_or(o.contention_window);
                 o.shard_after_contentions = a.count("shard_after_contentions").value_or(o.shard_after_contentions);
                 o.shard_block_limit = a.size("shard_block_limit").value_or(o.shard_block_limit);
                 o.growth_divisor = a.count("growth_divisor").value_or(o.growth_divisor);
                 o.minimum_growth = a.size("minimum_growth").value_or(o.minimum_growth);
                 o.growth_granularity = a.size("growth_granularity").value_or(o.growth_granularity);
                 o.consolidate_on_growth = a.flag("consolidate_on_growth").value_or(o.consolidate_on_growth);
                 o.grow_in_place = a.flag("grow_in_place").value_or(o.grow_in_place);
                 o.release_threshold = a.size("release_threshold").value_or(o.release_threshold);
                 o.record_on_demand = !a.flag("eager_events").value_or(false);
                 return std::make_shared<pool_memory_resource>(std::move(up), a.size("initial").value_or(0), a.size("max"),
                                                               o);
               }});
  r.back().validate = validate_pool;
  r.push_back({"fixed_size", "blocks of one size, O(1) allocate and free", needs_upstream,
               {size_param("block_size", optional_param, "the size of every block (rounded up to 256)", "1MiB").within(1, max_block),
                count_param("blocks_to_preallocate", optional_param, "blocks per chunk taken from the upstream", "128")
                    .within(1, MiB)},
               [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                 return std::make_shared<fixed_size_memory_resource>(
                     std::move(up), a.size("block_size").value_or(fixed_size_memory_resource::default_block_size),
                     a.count("blocks_to_preallocate").value_or(fixed_size_memory_resource::default_blocks_to_preallocate));
               }});
  r.back().validate = validate_fixed_size;
  r.push_back({"binning", "power-of-two size classes, each a fixed_size over the upstream; larger requests go "
                          "to the upstream",
               needs_upstream,
               {size_param_defaulting_to("min", "256B", "the smallest bin (rounded up to a power of two, at least 256)")
                    .within(1, max_block),
                size_param_defaulting_to("max", "64KiB", "the largest bin (rounded up to a power of two)")
                    .within(1, max_block)},
               [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                 return std::make_shared<binning_memory_resource>(std::move(up), *a.size("min"), *a.size("max"));
               }});
  r.back().validate = validate_binning;
  r.push_back({"arena", "per-stream arenas of size-classed superblocks over a global arena; takes memory "
                        "when first needed, up to its size, and gives wholly free chunks back",
               needs_upstream,
               {size_param_defaulting_to("size", "50%", "the arena's maximum: the most it holds from the upstream")
                    .within(1, max_memory),
                size_param("superblock_size", optional_param, "the unit stream arenas take from the global arena",
                           "4MiB")
                    .within(64 * KiB, 16 * MiB)
                    .power_of_two(),
                size_param("max_small_size", optional_param,
                           "requests up to this go to the stream arenas (a multiple of 256B, at most half a superblock)",
                           "1MiB")
                    .within(256, 8 * MiB),
                count_param("empty_superblocks_kept", optional_param,
                            "wholly free superblocks a stream arena keeps (it fetches and holds up to twice "
                            "as many, or an eighth of its superblocks when more, then hands the excess back at once)",
                            "4")
                    .within(0, arena_options::max_empty_superblocks_kept),
                flag_param("eager", optional_param,
                           "take the whole size at construction and keep it until destruction", "false"),
                size_param("max_free", optional_param,
                           "free bytes the global arena keeps before wholly free chunks go back",
                           "a quarter of size")
                    .within(0, max_memory),
                count_param("growth_divisor", optional_param, "a new chunk is at least held bytes / this", "12")
                    .within(1, 1024),
                size_param("minimum_growth", optional_param, "a new chunk is at least this", "32MiB")
                    .within(0, 512 * GiB),
                flag_param("grow_in_place", optional_param,
                           "over vmm/simulated_vmm: one chunk grown in place, free granules given back past max_free",
                           "true"),
                flag_param("thread_shards", optional_param,
                           "threads contending for one stream's arena get an arena each on that stream", "true"),
                count_param("shard_after_contentions", optional_param,
                            "give a stream thread shards once its arena's lock was found taken this many times "
                            "(0: once a second thread calls on it)",
                            "256")
                    .within(0, 1U << 30)},
               [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                 arena_options o;
                 o.superblock_size = a.size("superblock_size").value_or(o.superblock_size);
                 o.max_small_size = a.size("max_small_size").value_or(o.max_small_size);
                 o.empty_superblocks_kept = a.count("empty_superblocks_kept").value_or(o.empty_superblocks_kept);
                 o.eager = a.flag("eager").value_or(o.eager);
                 o.max_free_bytes = a.size("max_free").value_or(o.max_free_bytes);
                 o.growth_divisor = a.count("growth_divisor").value_or(o.growth_divisor);
                 o.minimum_growth = a.size("minimum_growth").value_or(o.minimum_growth);
                 o.grow_in_place = a.flag("grow_in_place").value_or(o.grow_in_place);
                 o.thread_shards = a.flag("thread_shards").value_or(o.thread_shards);
                 o.shard_after_contentions = a.count("shard_after_contentions").value_or(o.shard_after_contentions);
                 return std::make_shared<arena_memory_resource>(std::move(up), *a.size("size"), o);
               }});
  r.back().validate = validate_arena;

  // ---- adaptors ------------------------------------------------------------------------
  r.push_back({"logging", "writes every allocate/free as CSV (RMM's format) or binary records; replayable", needs_upstream,
               {text_param("file", optional_param, "the log file (created or truncated)", "$MRSTACK_LOG_FILE"),
                flag_param("auto_flush", optional_param, "flush after every record", "false"),
                flag_param("async", optional_param, "format and write on a background thread", "false"),
                count_param("queue_capacity", optional_param, "records the async ring holds",
                            std::to_string(logging_resource_adaptor::default_queue_capacity))
                    .within(16, logging_resource_adaptor::max_queue_capacity)
                    .power_of_two(),
                flag_param("per_thread", optional_param,
                           "with async: each thread writes its own rows in runs, a Stamp column orders them "
                           "(no merging writer to wait for)",
                           "false"),
                flag_param("binary", optional_param,
                           "32-byte records instead of CSV, written as per_thread writes (so async and per_thread "
                           "are implied); mrstack-replay reads them and --write-csv converts them",
                           "false")},
               [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                 bool const binary = a.flag("binary").value_or(false);
                 return std::make_shared<logging_resource_adaptor>(
                     std::move(up), a.text("file").value_or(""), a.flag("auto_flush").value_or(false),
                     a.flag("async").value_or(binary),
                     a.count("queue_capacity").value_or(logging_resource_adaptor::default_queue_capacity),
                     a.flag("per_thread").value_or(binary) ? log_order::per_thread : log_order::merged,
                     binary ? log_format::binary : log_format::csv);
               }});
  r.back().validate = validate_logging;
  r.back().output_file_parameter = "file";
  r.push_back({"limiting", "refuses allocations past a byte limit", needs_upstream,
               {size_param("limit", required, "bytes it may hand out at once"),
                size_param("granularity", optional_param, "each allocation counts rounded up to this", "256B")
                    .within(1, GiB)
                    .power_of_two()},
               [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                 return std::make_shared<limiting_resource_adaptor>(std::move(up), *a.size("limit"),
                                                                    a.size("granularity").value_or(default_alignment));
               }});
  r.push_back({"tracking", "remembers every outstanding allocation (optionally its call stack); foreign and double "
                           "frees become errors",
               needs_upstream,
               {flag_param("capture_stacks", optional_param, "record each allocation's call stack", "false"),
                flag_param("report_leaks", optional_param, "report what is outstanding at destruction (stderr)", "false")},
               [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                 return std::make_shared<tracking_resource_adaptor>(std::move(up), a.flag("capture_stacks").value_or(false),
                                                                    a.flag("report_leaks").value_or(false));
               }});
  r.push_back({"statistics", "counts bytes and allocations: current, peak, total", needs_upstream, {},
               [](spec_arguments const&, resource_ptr up) -> resource_ptr {
                 return std::make_shared<statistics_resource_adaptor>(std::move(up));
               }});
  r.push_back({"thread_safe", "one mutex around the layer below", needs_upstream, {},
               [](spec_arguments const&, resource_ptr up) -> resource_ptr {
                 return std::make_shared<thread_safe_resource_adaptor>(std::move(up));
               }});
  r.push_back({"aligned", "hands out memory aligned to more than 256 bytes", needs_upstream,
               {size_param("alignment", optional_param, "alignment for requests of at least threshold bytes", "256B")
                    .within(1, GiB)
                    .power_of_two(),
                size_param("threshold", optional_param, "requests this big or bigger get the alignment", "0")},
               [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                 return std::make_shared<aligned_resource_adaptor>(std::move(up),
                                                                   a.size("alignment").value_or(default_alignment),
                                                                   a.size("threshold").value_or(0));
               }});
  r.push_back({"retry", "when the upstream refuses, releases the stack below and tries again", needs_upstream,
               {count_param("max_retries", optional_param, "retries per refused request", "1").within(0, 1000)},
               [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                 return std::make_shared<failure_callback_resource_adaptor>(std::move(up),
                                                                            a.count("max_retries").value_or(1));
               }});

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
