#pragma once
// Memory freed and not yet handed out again, for model tests of stream-ordered reuse over
// the fake event seam: who freed each range, and when (the freeing stream's clock).
#include <fake_stream_sync.hpp>

#include <cstdint>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace mrstack::test {

class freed_ranges {
 public:
  void add(std::uintptr_t a, std::size_t n, std::uintptr_t freer, std::uint64_t clock) {
    ranges_[a] = range{a + n, freer, clock};
  }
  /// New work on `user` is about to use [a, a+n), which is live from now on. Returns ""
  /// when that work is ordered after every free there, else what it is not ordered after.
  std::string take(std::uintptr_t a, std::size_t n, std::uintptr_t user, fake_stream_sync const& fake) {
    std::uintptr_t const end = a + n;
    auto it = ranges_.upper_bound(a);
    if (it != ranges_.begin() && std::prev(it)->second.end > a) { --it; }
    std::vector<std::pair<std::uintptr_t, range>> keep;
    std::ostringstream unordered;
    while (it != ranges_.end() && it->first < end) {
      range const r = it->second;
      if (!fake.ordered_after(user, r.freer, r.clock)) {
        unordered << "block at 0x" << std::hex << a << " for stream 0x" << user << " overlaps memory freed on stream 0x"
                  << r.freer << std::dec << " at its clock " << r.clock << "; ";
      }
      if (it->first < a) { keep.emplace_back(it->first, range{a, r.freer, r.clock}); }
      if (r.end > end) { keep.emplace_back(end, range{r.end, r.freer, r.clock}); }
      it = ranges_.erase(it);
    }
    for (auto const& [k, r] : keep) { ranges_[k] = r; }
    return unordered.str();
  }

 private:
  struct range {
    std::uintptr_t end;
    std::uintptr_t freer;
    std::uint64_t clock;
  };
  std::map<std::uintptr_t, range> ranges_;
};

}  // namespace mrstack::test
