// libFuzzer target: random allocate/free sequences through the C ABI over every
// suballocator (and a few adaptors and bare upstreams), over simulated or host memory,
// with misuse mixed in: double frees, foreign and interior pointers, wrong sizes, stale
// EMM tokens and dead stack handles.
//
// Oracles (a broken one aborts: a finding):
// - no block handed out overlaps a live one; over host memory each block keeps the bytes
//   written into it until it is freed (another allocation scribbling on it is caught);
// - a correct free succeeds; a misuse comes back as an error status, never a success;
// - the C ABI's books (live count and bytes) match the model while no misuse happened,
//   and a stack whose allocations were all freed is destroyed with MRSTACK_SUCCESS.
//
// Misuse is switched per stack and kind: `detects` lists the misuse each stack's resources
// are known to refuse, and only that is mixed in by default, so the run stays green while
// the others are fixed. MRSTACK_FUZZ_MISUSE=all mixes every kind into every stack (to find
// what is not detected yet); =none mixes in nothing; a number (1 double, 2 foreign, 4 wrong
// size, 8 interior) mixes in those kinds everywhere. docs/reliability.md says what each
// stack refuses (on this build, every kind: the table leaves nothing out). The first input
// byte picks the stack, the rest are ops.
#include <mrstack/c_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace {

/// Kinds of misuse, as bits.
enum misuse_bits : unsigned {
  double_free = 1,      ///< a block freed again (not handed out since)
  foreign_free = 2,     ///< a pointer the stack never handed out
  wrong_size_free = 4,  ///< a live block freed with another size
  interior_free = 8,    ///< a pointer inside a live block
  every_misuse = 15,
};

struct stack_kind {
  char const* spec;
  bool touchable;    ///< host memory: the driver writes into blocks and checks them
  unsigned detects;  ///< the misuse this stack is known to refuse (misuse_bits)
  std::size_t max_bytes;
};

// Every suballocator, each alone over simulated memory and in a realistic stack; a few
// adaptors; the bare upstreams. `detects` as measured on this build (docs/reliability.md):
// every stack refuses every kind. A pool checks a free's size before it frees anything
// (so binning over a pool refuses too); the arena keeps a small block's own size where its
// class holds several, and maps a superblock before the global lock that carved it is let
// go (a stale large pointer whose range became superblocks is refused on any thread);
// `aligned` remembers the upstream's pointer behind each over-aligned block, so a stale
// pointer that is now the start of that block's padding is refused, not passed down.
// The inputs of the findings behind the last two are seeds in corpus/c_api/
// (tests/fuzz/findings/README.md).
constexpr std::array<stack_kind, 16> stacks{{
    {"pool > simulated(capacity=4GiB)", false, every_misuse, 64u << 20},
    {"pool(initial=1MiB, growth_granularity=64KiB, minimum_growth=256KiB) > system", true, every_misuse, 256u << 10},
    {"pool > simulated_vmm(capacity=4GiB)", false, every_misuse, 64u << 20},
    {"arena(size=256MiB) > simulated", false, every_misuse, 8u << 20},
    {"arena(size=8MiB, superblock_size=64KiB, max_small_size=16KiB) > system", true, every_misuse, 256u << 10},
    {"fixed_size(block_size=64KiB) > simulated", false, every_misuse, 64u << 10},
    {"fixed_size(block_size=4KiB, blocks_to_preallocate=16) > system", true, every_misuse, 4u << 10},
    {"binning > simulated(capacity=4GiB)", false, every_misuse, 1u << 20},
    {"binning(min=256B, max=1MiB) > pool > simulated", false, every_misuse, 4u << 20},
    {"binning(max=16KiB) > system", true, every_misuse, 256u << 10},
    {"tracking > binning > system", true, every_misuse, 256u << 10},
    {"statistics > limiting(64MiB) > pool > simulated", false, every_misuse, 8u << 20},
    {"aligned(alignment=4KiB, threshold=64KiB) > pool > simulated", false, every_misuse, 1u << 20},
    {"thread_safe > retry > arena(size=64MiB) > simulated", false, every_misuse, 4u << 20},
    {"simulated(capacity=1GiB)", false, every_misuse, 16u << 20},
    {"system", true, every_misuse, 256u << 10},
}};

/// The misuse mixed into `kind`: its `detects`, unless MRSTACK_FUZZ_MISUSE says `all`,
/// `none` or a number (misuse_bits, the same for every stack).
unsigned misuse_for(stack_kind const& kind) {
  static char const* const env = std::getenv("MRSTACK_FUZZ_MISUSE");
  if (env == nullptr || *env == '\0') { return kind.detects; }
  std::string_view const v{env};
  if (v == "all") { return every_misuse; }
  if (v == "none") { return 0; }
  return static_cast<unsigned>(std::strtoul(env, nullptr, 0)) & every_misuse;
}

/// MRSTACK_FUZZ_TRACE=1: every call on stderr (to read a finding's input back).
bool tracing() {
  static bool const on = std::getenv("MRSTACK_FUZZ_TRACE") != nullptr;
  return on;
}

void trace(char const* what, std::uintptr_t at, std::size_t bytes, int status) {
  if (tracing()) { std::fprintf(stderr, "  %-12s 0x%zx %zu B -> %d\n", what, static_cast<std::size_t>(at), bytes, status); }
}

[[noreturn]] void finding(stack_kind const& kind, std::string const& what) {
  std::fprintf(stderr, "fuzz_c_api: [%s] %s (last error: %s)\n", kind.spec, what.c_str(), mrstack_last_error());
  std::abort();
}

/// Reads the op stream: bytes, then zeros once it runs out.
struct reader {
  std::uint8_t const* data;
  std::size_t size;
  std::size_t at = 0;
  bool more() const { return at < size; }
  std::uint8_t byte() { return at < size ? data[at++] : 0; }
  std::uint32_t u16() { return static_cast<std::uint32_t>(byte()) << 8 | byte(); }
};

struct block {
  std::size_t bytes;
  int client;
  unsigned char tag;
};

class driver {
 public:
  driver(stack_kind const& kind, mrstack_stack* stack)
      : kind_{kind}, stack_{stack},
        misuse_{misuse_for(kind)} {}

  void run(reader& in) {
    for (int ops = 0; in.more() && ops < 512; ++ops) {
      std::uint8_t const op = in.byte();
      switch (op % 8) {
        case 0: case 1: case 2: allocate(in); break;
        case 3: case 4: free_live(in); break;
        case 5: emm(in); break;
        case 6: misuse(in); break;
        case 7: check_books(); break;
      }
    }
    check_books();
    while (!live_.empty()) { free_one(live_.begin()); }
    for (auto token : tokens_) { (void)mrstack_emm_free(stack_, token); }
  }

  [[nodiscard]] bool misused() const { return misused_; }

 private:
  std::size_t size_from(reader& in) {
    std::uint32_t const raw = in.u16();
    std::size_t const shift = raw >> 12;  // 0..15
    std::size_t const bytes = (static_cast<std::size_t>(raw & 0xfff) + 1) << shift;
    return bytes % kind_.max_bytes + (raw % 3 == 0 ? 0 : 1);
  }

  void allocate(reader& in) {
    std::size_t const bytes = size_from(in);
    int const client = in.byte() % MRSTACK_CLIENT_COUNT;
    void* p = nullptr;
    auto const status = mrstack_allocate(stack_, bytes, nullptr, client, &p);
    trace("allocate", reinterpret_cast<std::uintptr_t>(p), bytes, status);
    if (status == MRSTACK_ERROR_OUT_OF_MEMORY || status == MRSTACK_ERROR_LOGIC) { return; }
    if (status != MRSTACK_SUCCESS) { finding(kind_, "allocate returned " + std::string{mrstack_status_name(status)}); }
    if (p == nullptr) {
      if (bytes != 0) { finding(kind_, "a successful allocation of " + std::to_string(bytes) + " B returned null"); }
      return;
    }
    auto const at = reinterpret_cast<std::uintptr_t>(p);
    if (overlaps_live(at, bytes)) { finding(kind_, "a new block overlaps a live one"); }
    auto const tag = static_cast<unsigned char>(++serial_);
    if (kind_.touchable) {  // the block's two ends: enough to see a neighbour write into it
      std::memset(p, tag, std::min<std::size_t>(bytes, edge));
      std::memset(static_cast<unsigned char*>(p) + bytes - std::min<std::size_t>(bytes, edge), tag,
                  std::min<std::size_t>(bytes, edge));
    }
    live_.emplace(at, block{bytes, client, tag});
    freed_.erase(at);
  }

  static constexpr std::size_t edge = 64;

  void free_live(reader& in) {
    if (live_.empty()) { return; }
    auto it = live_.begin();
    std::advance(it, in.byte() % live_.size());
    free_one(it);
  }

  void free_one(std::map<std::uintptr_t, block>::iterator it) {
    auto* p = reinterpret_cast<unsigned char*>(it->first);
    block const b = it->second;
    if (kind_.touchable && (p[0] != b.tag || p[b.bytes - 1] != b.tag)) {
      finding(kind_, "a live block's bytes were overwritten (another allocation shares it)");
    }
    auto const status = mrstack_deallocate(stack_, p, b.bytes, nullptr, b.client);
    trace("free", it->first, b.bytes, status);
    live_.erase(it);
    if (status != MRSTACK_SUCCESS && !misused_) { finding(kind_, "a correct free failed"); }
    freed_.emplace(reinterpret_cast<std::uintptr_t>(p), b);
  }

  void emm(reader& in) {
    if (in.byte() % 2 == 0 || tokens_.empty()) {
      std::uint64_t ptr = 0;
      std::size_t const bytes = 1 + in.byte() * 64;
      std::uint64_t const token = mrstack_emm_memalloc_token(stack_, bytes, MRSTACK_CLIENT_NUMBA, &ptr);
      trace("emm allocate", ptr, bytes, token == 0);
      if (token == 0) { return; }
      if (overlaps_live(ptr, bytes)) { finding(kind_, "a new EMM block overlaps a live one"); }
      tokens_.push_back(token);
      emm_live_.emplace(ptr, block{bytes, MRSTACK_CLIENT_NUMBA, 0});
      emm_of_token_.emplace(token, ptr);
      freed_.erase(ptr);
      return;
    }
    std::size_t const at = in.byte() % tokens_.size();
    trace("emm free", emm_of_token_[tokens_[at]], 0, 0);
    if (mrstack_emm_free(stack_, tokens_[at]) != 1) { finding(kind_, "an EMM free of a live token did not free"); }
    if (mrstack_emm_free(stack_, tokens_[at]) != 0) { finding(kind_, "a second EMM free of a token was not a no-op"); }
    emm_live_.erase(emm_of_token_[tokens_[at]]);
    emm_of_token_.erase(tokens_[at]);
    tokens_.erase(tokens_.begin() + static_cast<std::ptrdiff_t>(at));
  }

  void expect_refused(mrstack_status status, char const* what) {
    trace(what, 0, 0, status);
    misused_ = true;
    if (status == MRSTACK_SUCCESS) { finding(kind_, std::string{what} + " was accepted"); }
  }

  void misuse(reader& in) {
    unsigned const kind = in.byte() % 4;
    if ((misuse_ & (1u << kind)) == 0) { return; }
    if (kind == 0 && !freed_.empty()) {  // double free of a block not handed out again since
      auto it = freed_.begin();
      std::advance(it, in.byte() % freed_.size());
      if (overlaps_live(it->first, it->second.bytes)) { return; }
      trace("double free of", it->first, it->second.bytes, 0);
      expect_refused(mrstack_deallocate(stack_, reinterpret_cast<void*>(it->first), it->second.bytes, nullptr,
                                        it->second.client),
                     "a double free");
    } else if (kind == 1) {  // a pointer the stack never handed out
      alignas(4096) static unsigned char foreign[8192];
      expect_refused(mrstack_deallocate(stack_, foreign + 256 * (in.byte() % 8), 256, nullptr, 0), "a foreign free");
    } else if (kind == 2 && !live_.empty()) {  // a free with the wrong size, then the right one
      auto it = live_.begin();
      std::advance(it, in.byte() % live_.size());
      block const b = it->second;
      expect_refused(mrstack_deallocate(stack_, reinterpret_cast<void*>(it->first), b.bytes + (2u << 20), nullptr,
                                        b.client),
                     "a wrong-size free");
      // The block may have been freed anyway (some resources do): its right free may fail.
      (void)mrstack_deallocate(stack_, reinterpret_cast<void*>(it->first), b.bytes, nullptr, b.client);
      freed_.emplace(it->first, b);
      live_.erase(it);
    } else if (kind == 3 && !live_.empty()) {  // an interior pointer of a live block
      auto const& [at, b] = *live_.begin();
      if (b.bytes <= 512) { return; }
      expect_refused(mrstack_deallocate(stack_, reinterpret_cast<void*>(at + 256), b.bytes - 256, nullptr, b.client),
                     "a free of an interior pointer");
    }
  }

  bool overlaps_live(std::uintptr_t at, std::size_t bytes) const {
    return overlaps(live_, at, bytes) || overlaps(emm_live_, at, bytes);
  }

  static bool overlaps(std::map<std::uintptr_t, block> const& blocks, std::uintptr_t at, std::size_t bytes) {
    auto next = blocks.lower_bound(at);
    if (next != blocks.end() && next->first < at + bytes) { return true; }
    if (next == blocks.begin()) { return false; }
    auto const prev = std::prev(next);
    return prev->first + prev->second.bytes > at;
  }

  void check_books() {
    if (misused_) { return; }
    mrstack_statistics s{};
    if (mrstack_get_statistics(stack_, &s) != MRSTACK_SUCCESS) { finding(kind_, "statistics failed"); }
    std::uint64_t count = 0;
    for (auto const& c : s.clients) { count += c.live_count; }
    if (count != live_.size() + tokens_.size() || s.emm_outstanding != tokens_.size()) {
      finding(kind_, "the C ABI's books disagree with the model");
    }
  }

  stack_kind const& kind_;
  mrstack_stack* stack_;
  unsigned misuse_;  ///< the misuse_bits mixed in
  bool misused_ = false;
  unsigned serial_ = 0;
  std::map<std::uintptr_t, block> live_;
  std::map<std::uintptr_t, block> freed_;
  std::vector<std::uint64_t> tokens_;
  std::map<std::uintptr_t, block> emm_live_;  // EMM allocations, by address
  std::map<std::uint64_t, std::uintptr_t> emm_of_token_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  if (size == 0) { return 0; }
  stack_kind const& kind = stacks[data[0] % stacks.size()];
  mrstack_stack* stack = nullptr;
  if (mrstack_stack_create(kind.spec, 0, &stack) != MRSTACK_SUCCESS) { finding(kind, "the stack did not build"); }
  reader in{data + 1, size - 1};
  driver d{kind, stack};
  d.run(in);
  auto const status = mrstack_stack_destroy(stack);
  if (status != MRSTACK_SUCCESS && !d.misused()) { finding(kind, "destroying a stack with nothing live failed"); }
  // The handle is dead now: every call must say so.
  void* p = nullptr;
  if (mrstack_allocate(stack, 256, nullptr, 0, &p) != MRSTACK_ERROR_INVALID_ARGUMENT) {
    finding(kind, "a destroyed handle was accepted");
  }
  return 0;
}
