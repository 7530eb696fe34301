// lean_mutex's slow paths: spinning, sleeping on the lock word, waking a sleeper
// (include/mrstack/detail/lean_mutex.hpp says why the unlock may miss a sleeper and how
// the bound covers it).
#include <mrstack/detail/lean_mutex.hpp>

#include <mrstack/detail/cpu_pause.hpp>

#include <thread>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

namespace mrstack::detail {

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
                  std::atomic<std::uint32_t>::is_always_lock_free,
              "the futex calls name the lock word by its address");

void lean_mutex::lock_contended() noexcept {
  for (int i = 0; i < spins_before_sleeping; ++i) {
    cpu_pause();
    if (state_.load(std::memory_order_relaxed) == free && try_lock()) { return; }
  }
  // Counted before the look that decides to sleep: an unlock whose store that look
  // missed reads the count, unless the race in the header lets it read too early.
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  while (!try_lock()) { sleep_while_held(); }
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
}

#if defined(__linux__)

namespace {
std::uint32_t* word(std::atomic<std::uint32_t>& a) noexcept { return reinterpret_cast<std::uint32_t*>(&a); }
}  // namespace

void lean_mutex::sleep_while_held() noexcept {
  // The kernel sleeps only while the word still reads `held`, so an unlock between the
  // failed try and this call is never slept through. Any return (woken, timed out,
  // interrupted, the word changed) goes back to trying.
  timespec const bound{0, static_cast<long>(std::chrono::nanoseconds{sleep_bound}.count())};
  (void)syscall(SYS_futex, word(state_), FUTEX_WAIT_PRIVATE, held, &bound, nullptr, 0);
}

void lean_mutex::wake_one() noexcept { (void)syscall(SYS_futex, word(state_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0); }

#else

void lean_mutex::sleep_while_held() noexcept { std::this_thread::sleep_for(sleep_bound / 8); }  // a nap: nobody wakes it
void lean_mutex::wake_one() noexcept {}

#endif

}  // namespace mrstack::detail
