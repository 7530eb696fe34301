// Adaptors on a real device: a logging > limiting > pool > cuda stack (logging > limiting
// > cuda until the pool is built) writes and reads device memory on several streams and
// threads, enforces its limit, and logs exactly what happened; and a statistics >
// tracking > aligned > cuda stack hands out usable, over-aligned device memory.
#include <catch2/catch.hpp>

#include <mrstack/adaptor/aligned_resource_adaptor.hpp>
#include <mrstack/adaptor/limiting_resource_adaptor.hpp>
#include <mrstack/adaptor/logging_resource_adaptor.hpp>
#include <mrstack/adaptor/statistics_resource_adaptor.hpp>
#include <mrstack/adaptor/tracking_resource_adaptor.hpp>
#include <mrstack/upstream/cuda_memory_resource.hpp>

#if __has_include(<mrstack/suballoc/pool_memory_resource.hpp>)
#include <mrstack/suballoc/pool_memory_resource.hpp>
#define MRSTACK_TEST_HAVE_POOL 1
#else
#define MRSTACK_TEST_HAVE_POOL 0
#endif

#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace mrstack;

namespace {

/// Fills [ptr, ptr+bytes) on `s` with a pattern that depends on `seed`, copies it back and checks it.
void check_write_read(void* ptr, std::size_t bytes, stream_view s, unsigned char seed) {
  auto* p = static_cast<unsigned char*>(ptr);
  MRSTACK_CUDA_TRY(cudaMemsetAsync(p, seed, bytes, s.value()));
  if (bytes >= 2) {
    MRSTACK_CUDA_TRY(cudaMemsetAsync(p + bytes / 2, static_cast<unsigned char>(seed ^ 0xff), bytes - bytes / 2, s.value()));
  }
  std::vector<unsigned char> host(bytes);
  MRSTACK_CUDA_TRY(cudaMemcpyAsync(host.data(), p, bytes, cudaMemcpyDeviceToHost, s.value()));
  s.synchronize();
  CHECK(host.front() == seed);
  if (bytes >= 2) {
    CHECK(host[bytes / 2 - 1] == seed);
    CHECK(host.back() == static_cast<unsigned char>(seed ^ 0xff));
  }
}

struct log_row {
  std::string thread;
  std::string action;
  std::string pointer;
  std::size_t size = 0;
  std::string stream;
};

std::vector<log_row> parse(std::string const& text) {
  std::istringstream in{text};
  std::string line;
  REQUIRE(std::getline(in, line));
  REQUIRE(line == "Thread,Time,Action,Pointer,Size,Stream");
  std::vector<log_row> rows;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ls{line};
    for (std::string x; std::getline(ls, x, ',');) { f.push_back(x); }
    INFO(line);
    REQUIRE(f.size() == 6);
    rows.push_back(log_row{f[0], f[2], f[3], std::stoull(f[4]), f[5]});
  }
  return rows;
}

std::string hex(void const* p) {
  std::ostringstream os;
  os << "0x" << std::hex << reinterpret_cast<std::uintptr_t>(p);
  return os.str();
}

resource_ptr make_pool_or_pass(resource_ptr cuda) {
#if MRSTACK_TEST_HAVE_POOL
  return std::make_shared<pool_memory_resource>(std::move(cuda), std::size_t{64} << 20);
#else
  WARN("pool_memory_resource not built yet: testing logging > limiting > cuda");
  return cuda;
#endif
}

}  // namespace

TEST_CASE("logging > limiting > pool > cuda: data round-trips, the limit holds, the log is exact") {
  bool const async = GENERATE(false, true);
  INFO("async logging: " << async);
  std::size_t const limit = std::size_t{48} << 20;
  auto cuda = std::make_shared<cuda_memory_resource>();
  auto below = make_pool_or_pass(cuda);
  auto limiting = std::make_shared<limiting_resource_adaptor>(below, limit);
  std::ostringstream out;
  auto log = std::make_shared<logging_resource_adaptor>(limiting, out, false, async);
  INFO(describe_stack(*log));
  CHECK(log->kind() == memory_kind::device);

  constexpr int threads = 4;
  std::mutex m;
  std::map<std::string, std::vector<log_row>> expected;  // by thread id
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      stream s;
      std::ostringstream sid;
      sid << "0x" << std::hex << s.view().id();
      std::string const me = std::to_string(logging_resource_adaptor::current_thread_id());
      std::vector<log_row> mine;
      for (int i = 0; i < 50; ++i) {
        std::size_t const bytes = (std::size_t{1} << (10 + (i + t) % 10)) + static_cast<std::size_t>(i);  // 1 KiB .. 512 KiB
        void* p = log->allocate(bytes, s);
        mine.push_back(log_row{me, "allocate", hex(p), bytes, sid.str()});
        check_write_read(p, bytes, s, static_cast<unsigned char>(t * 50 + i));
        log->deallocate(p, bytes, s);
        mine.push_back(log_row{me, "free", hex(p), bytes, sid.str()});
      }
      std::lock_guard lock{m};
      expected[me] = std::move(mine);
    });
  }
  for (auto& th : pool) { th.join(); }
  CHECK(limiting->used_bytes() == 0);

  // Fill to the limit with 4 MiB blocks: the refusal comes from the limiting layer and
  // names the limit; nothing past the limit was handed out.
  stream s;
  std::vector<void*> held;
  std::size_t const block = std::size_t{4} << 20;
  std::string refusal;
  try {
    for (;;) {
      held.push_back(log->allocate(block, s));
      REQUIRE(held.size() <= limit / block);
    }
  } catch (out_of_memory const& e) {
    refusal = e.what();
    CHECK(e.info().resource == "limiting");
  }
  CHECK(held.size() == limit / block);
  CHECK_THAT(refusal, Catch::Contains("limit 48.00 MiB"));
  for (std::size_t i = 0; i < held.size(); ++i) { check_write_read(held[i], block, s, static_cast<unsigned char>(i)); }
  for (void* p : held) { log->deallocate(p, block, s); }
  CHECK(limiting->used_bytes() == 0);
  log->flush();

  auto const rows = parse(out.str());
  std::map<std::string, std::vector<log_row>> by_thread;
  for (auto const& r : rows) { by_thread[r.thread].push_back(r); }
  for (auto const& [tid, mine] : expected) {
    auto const& got = by_thread[tid];
    REQUIRE(got.size() == mine.size());
    for (std::size_t i = 0; i < mine.size(); ++i) {
      INFO("thread " << tid << " row " << i);
      CHECK(got[i].action == mine[i].action);
      CHECK(got[i].pointer == mine[i].pointer);
      CHECK(got[i].size == mine[i].size);
      CHECK(got[i].stream == mine[i].stream);
    }
  }
  auto const main_id = std::to_string(logging_resource_adaptor::current_thread_id());
  auto const& main_rows = by_thread[main_id];
  std::size_t allocs = 0;
  std::size_t failures = 0;
  std::size_t frees = 0;
  for (auto const& r : main_rows) {
    allocs += r.action == "allocate";
    failures += r.action == "allocate failure";
    frees += r.action == "free";
  }
  CHECK(allocs == held.size());
  CHECK(failures == 1);
  CHECK(frees == held.size());
  CHECK(rows.size() == threads * 100 + 2 * held.size() + 1);
}

TEST_CASE("statistics > tracking > aligned > cuda: over-aligned device memory, counted and tracked") {
  auto cuda = std::make_shared<cuda_memory_resource>();
  auto aligned = std::make_shared<aligned_resource_adaptor>(cuda, 4096, 1 << 16);
  auto tracking = std::make_shared<tracking_resource_adaptor>(aligned, true);
  statistics_resource_adaptor stats{tracking};
  stream s;
  std::vector<std::pair<void*, std::size_t>> held;
  for (std::size_t bytes : {std::size_t{1000}, std::size_t{1} << 16, (std::size_t{3} << 20) + 5}) {
    void* p = stats.allocate(bytes, s);
    if (bytes >= (1 << 16)) { CHECK(detail::is_aligned(p, 4096)); }
    check_write_read(p, bytes, s, static_cast<unsigned char>(bytes));
    held.emplace_back(p, bytes);
  }
  void* big_align = stats.allocate(100, s, 1 << 16);  // asked for 64 KiB: cuda alone refuses that
  CHECK(detail::is_aligned(big_align, 1 << 16));
  check_write_read(big_align, 100, s, 0x42);
  CHECK(tracking->outstanding_count() == 4);
  CHECK(stats.bytes_counter().value == static_cast<std::int64_t>(1000 + (1 << 16) + (3 << 20) + 5 + 100));
  CHECK_THROWS_AS(stats.deallocate(held[0].first, held[0].second + 1, s), logic_error);  // tracking catches it
  stats.deallocate(big_align, 100, s, 1 << 16);
  for (auto [p, n] : held) { stats.deallocate(p, n, s); }
  CHECK(tracking->outstanding_count() == 0);
  CHECK(aligned->outstanding_over_aligned() == 0);
  CHECK(stats.bytes_counter().value == 0);
  CHECK(stats.allocations_counter().peak == 4);
}
