// Stack specs: what check_stack_spec refuses ahead of the build (logging's flags,
// simulated_vmm's granule count), the rules that join two layers and are refused only
// when built, and build errors that name the part at fault: the bottom's own capacity
// under a percentage, and a layer below refusing a request made while building the one
// above.
#include <catch2/catch.hpp>

#include <mrstack/spec.hpp>

#include <string>

using namespace mrstack;

namespace {

/// The spec must fail (at check, or when built) with the caret under the first `at` in it.
void require_error(std::string const& spec, std::string const& at, std::string const& what, bool build = false) {
  INFO("spec: " << spec);
  std::size_t const column = spec.find(at) + 1;
  REQUIRE(column != 0);
  try {
    auto const parsed = parse_stack_spec(spec);
    if (build) {
      (void)build_stack(parsed);
    } else {
      check_stack_spec(parsed);
    }
    FAIL("no error for a bad spec");
  } catch (spec_error const& e) {
    INFO("message:\n" << e.what());
    CHECK(e.column() == column);
    CHECK_THAT(std::string{e.what()}, Catch::Contains(what));
  }
}

}  // namespace

TEST_CASE("spec checks: logging's flags are checked with the spec, as the build refuses them") {
  // Each was accepted by check_stack_spec (and so by mrstack_configure) and refused by every build.
  for (bool build : {false, true}) {
    require_error("logging(file=/dev/null, per_thread) > system", "per_thread", "per_thread needs async", build);
    require_error("logging(file=/dev/null, per_thread, async=false) > system", "false",
                  "per_thread needs async", build);
    require_error("logging(file=/dev/null, binary, per_thread=false) > system", "false",
                  "per_thread=false cannot go with binary", build);
    require_error("logging(file=/dev/null, async=false, binary) > system", "false",
                  "async=false cannot go with binary", build);
    // A synchronous log has no queue: the capacity was taken and ignored.
    require_error("logging(file=/dev/null, queue_capacity=1024) > system", "1024",
                  "queue_capacity sizes the asynchronous queues: it needs async (or binary)", build);
    require_error("logging(file=/dev/null, async=false, queue_capacity=64) > system", "false",
                  "it needs async (or binary)", build);
  }
  for (char const* ok : {"logging(file=x, binary) > system", "logging(file=x, async, per_thread) > system",
                         "logging(file=x, binary, queue_capacity=64) > system",
                         "logging(file=x, async, queue_capacity=64) > system",
                         "logging(file=x, binary, async=true, per_thread=true) > system", "logging(file=x) > system"}) {
    INFO(ok);
    CHECK_NOTHROW(check_stack_spec(parse_stack_spec(ok)));
  }
}

TEST_CASE("spec checks: simulated_vmm's reserve is at most 2^31 granules") {
  // docs give granularity 256B to 1GiB, but the default 1TiB reserve in 256 B granules
  // is 2^32 granules: every build refused it.
  for (bool build : {false, true}) {
    require_error("simulated_vmm(granularity=256)", "256", "reserve 1TiB is 4294967296 granules of 256B", build);
    require_error("simulated_vmm(reserve=600GiB, granularity=256)", "600GiB", "reserve at most 512GiB", build);
  }
  CHECK_NOTHROW(make_stack("simulated_vmm(granularity=512)"));
  CHECK_NOTHROW(make_stack("simulated_vmm(reserve=512GiB, granularity=256)"));
  // A reserve given as a share is not known while checking: it is not judged at its default.
  CHECK_NOTHROW(check_stack_spec(parse_stack_spec("simulated_vmm(capacity=1GiB, reserve=1%, granularity=256)")));
  CHECK_NOTHROW(make_stack("simulated_vmm(capacity=1GiB, reserve=50%, granularity=256)"));
}

TEST_CASE("spec checks: a pool's sizes against the range below are refused when built, as spec errors") {
  // An initial size past the reserve escaped as std::invalid_argument from the growth code.
  std::string const spec = "pool(initial=64MiB) > simulated_vmm(reserve=32MiB)";
  CHECK_NOTHROW(check_stack_spec(parse_stack_spec(spec)));  // the range is known only when built
  require_error(spec, "pool", "passes simulated_vmm's reserve of 32.00 MiB", true);
  require_error("pool(max=1MiB) > simulated_vmm", "pool", "less than one of simulated_vmm's granules", true);
  CHECK_NOTHROW(make_stack("pool(initial=32MiB) > simulated_vmm(reserve=32MiB)"));
}

TEST_CASE("spec checks: a percentage over a bad capacity reports the capacity's own error") {
  // The capacity was read before its layer was checked: a bad one was ignored and the
  // percentage fell back to the device ("no usable CUDA device").
  require_error("arena(size=50%) > simulated(capacity=8G)", "8G", "the unit 'G' is ambiguous", true);
  require_error("arena > simulated(capacity=8 gigs)", "8 gigs", "unknown unit 'gigs'", true);
  require_error("arena > simulated(capacity=1GiB, bogus=1)", "bogus", "unknown parameter 'bogus'", true);
  // A good capacity is still the base, and a percentage capacity still falls to the device.
  auto const stack = make_stack("arena(size=50%) > simulated(capacity=8GiB)");
  CHECK(stack != nullptr);
}

TEST_CASE("spec checks: a layer below refusing a request made while building the one above is named as such") {
  // Reported as "binning refused its arguments", caret on binning.
  require_error("binning > fixed_size > simulated", "fixed_size",
                "fixed_size refused a request binning made while being built over it: fixed_size: request of "
                "2.00 MiB",
                true);
  // Both layers have one name: either may have said it, and the message says so.
  require_error("fixed_size(blocks_to_preallocate=2) > fixed_size > simulated", "fixed_size(",
                "fixed_size could not be built over fixed_size: it refused its arguments, or fixed_size below it "
                "refused a request fixed_size made while being built",
                true);
  // A constructor's own refusal still names its arguments.
  require_error("pool(max=1MiB) > simulated_vmm", "pool", "pool refused its arguments", true);
}
