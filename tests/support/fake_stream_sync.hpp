#pragma once
// A recording, checking stand-in for CUDA events, so stream-ordered reuse is model-tested
// on the CPU. Each stream has a clock (how much work was enqueued on it) and a vector
// clock of what it has waited for; events capture the recording stream's vector clock
// and `wait` merges it into the waiter's, exactly as cudaEventRecord/cudaStreamWaitEvent
// order work. `ordered_after` answers the question a correct allocator must respect:
// is work now enqueued on `user` guaranteed to run after work `clock` of `freer`?
#include <mrstack/detail/stream_ordering.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <set>

namespace mrstack::test {

class fake_stream_sync final : public detail::stream_sync {
 public:
  using vclock = std::map<handle, std::uint64_t>;

  // ---- the test's side ----
  /// Enqueues one unit of work on `stream`; returns its clock value.
  std::uint64_t enqueue(handle stream) { return ++now_[stream]; }
  /// True when new work on `user` is ordered after work number `clock` of `freer`.
  bool ordered_after(handle user, handle freer, std::uint64_t clock) const {
    if (user == freer) { return true; }
    auto const done = done_.find(freer);
    if (done != done_.end() && done->second >= clock) { return true; }
    auto const known = known_.find(user);
    if (known == known_.end()) { return false; }
    auto const k = known->second.find(freer);
    return k != known->second.end() && k->second >= clock;
  }
  /// The stream is destroyed from now on. Real CUDA gives no error for a destroyed
  /// stream handle — naming one is undefined behaviour (a crash in the driver) — so every
  /// record, wait or synchronize on it is counted in `dead_named`; correct code keeps
  /// that at 0. (The record still reports failure, as the kindest outcome UB could have.)
  void kill(handle stream) { dead_.insert(stream); }
  [[nodiscard]] bool is_dead(handle stream) const { return dead_.count(stream) != 0; }
  std::size_t dead_named = 0;
  /// A blocking stream (as per-thread default streams are): it orders with the legacy
  /// default stream (handle 0) both ways, as CUDA specifies.
  void set_blocking(handle stream) { blocking_.insert(stream); }
  /// Called on every record with the stream handle (tests check who may record where).
  std::function<void(handle)> on_record;
  /// The device has run all the work enqueued on `stream` so far (and, for `idle`, what
  /// it waits for is done only when that stream's work is completed too).
  void complete(handle stream) { done_[stream] = now_[stream]; }
  /// Whether `idle` answers truly; off, it always says busy (as the seam's default does),
  /// which keeps the tests written before idle streams settled their memory as they were.
  bool report_idle = false;
  std::size_t queries = 0;
  /// Graph capture of `stream` begins / ends. While it lasts CUDA runs nothing of the
  /// stream's new work, and another stream cannot wait on an event recorded there: every
  /// record on it is counted in `records_in_capture` (correct code keeps that at 0), and
  /// `idle` says busy (as the CUDA seam does, asking nothing that would end the capture).
  void begin_capture(handle stream) { captured_.insert(stream); }
  void end_capture(handle stream) { captured_.erase(stream); }
  std::size_t records_in_capture = 0;
  /// Waits into a captured stream (CUDA refuses them and ends the capture), and device or
  /// stream synchronizations while any capture lasts: correct code keeps both at 0.
  std::size_t waits_into_capture = 0, syncs_in_capture = 0;

  std::size_t creates = 0, destroys = 0, records = 0, waits = 0, syncs = 0, sync_alls = 0;
  [[nodiscard]] std::size_t calls() const { return creates + destroys + records + waits + syncs + sync_alls + queries; }
  [[nodiscard]] std::size_t live_events() const { return events_.size(); }

  // ---- the seam ----
  handle create_event() override {
    ++creates;
    handle const e = ++next_event_;
    events_[e] = vclock{};
    return e;
  }
  void destroy_event(handle event) noexcept override {
    ++destroys;
    events_.erase(event);
  }
  bool record(handle event, handle stream) override {
    ++records;
    if (on_record) { on_record(stream); }
    if (captured_.count(stream) != 0) { ++records_in_capture; }
    if (dead_.count(stream) != 0) {
      ++dead_named;
      return false;
    }
    if (stream == legacy) { legacy_barrier(); }
    vclock c = known_[stream];
    c[stream] = now_[stream];
    events_.at(event) = c;
    return true;
  }
  void wait(handle stream, handle event) override {
    ++waits;
    if (captured_.count(stream) != 0) { ++waits_into_capture; }
    if (dead_.count(stream) != 0) { ++dead_named; }
    if (stream == legacy) { legacy_barrier(); }
    for (auto const& [s, t] : events_.at(event)) {
      auto& mine = known_[stream][s];
      mine = std::max(mine, t);
    }
  }
  void synchronize(handle stream) override {
    ++syncs;
    if (!captured_.empty()) { ++syncs_in_capture; }
    if (dead_.count(stream) != 0) { ++dead_named; }
    done_[stream] = now_[stream];
  }
  bool capturing(handle stream) override {
    if (dead_.count(stream) != 0) { ++dead_named; }
    return captured_.count(stream) != 0;
  }
  void synchronize_all() override {
    ++sync_alls;
    if (!captured_.empty()) { ++syncs_in_capture; }
    for (auto const& [s, t] : now_) { done_[s] = t; }
  }
  /// Idle: its own work is done, and so is all the work of other streams it waited for.
  bool idle(handle stream) override {
    ++queries;
    if (dead_.count(stream) != 0) {
      ++dead_named;
      return false;
    }
    if (!report_idle || captured_.count(stream) != 0) { return false; }
    auto finished = [&](handle s, std::uint64_t t) { return t == 0 || done_[s] >= t; };
    if (!finished(stream, now_[stream])) { return false; }
    for (auto const& [s, t] : known_[stream]) {
      if (!finished(s, t)) { return false; }
    }
    return true;
  }

 private:
  static constexpr handle legacy = 0;
  static void merge(vclock& into, vclock const& from) {
    for (auto const& [s, t] : from) { into[s] = std::max(into[s], t); }
  }
  /// Work on the legacy stream waits for all earlier work of every blocking stream, and
  /// every blocking stream's later work waits for it.
  void legacy_barrier() {
    vclock& mine = known_[legacy];
    for (handle b : blocking_) {
      mine[b] = std::max(mine[b], now_[b]);
      merge(mine, known_[b]);
    }
    vclock after = mine;
    after[legacy] = now_[legacy];
    for (handle b : blocking_) { merge(known_[b], after); }
  }

  std::set<handle> blocking_;
  std::set<handle> captured_;
  std::map<handle, std::uint64_t> now_;
  std::map<handle, vclock> known_;
  std::map<handle, std::uint64_t> done_;
  std::map<handle, vclock> events_;
  std::set<handle> dead_;
  handle next_event_ = 0;
};

}  // namespace mrstack::test
