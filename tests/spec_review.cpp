// Stack specs, cases found in review: values that did not read back as themselves,
// device ordinals that wrapped to another device, numbers that were no numbers, and
// carets that pointed at the wrong argument.
#include <catch2/catch.hpp>

#include <mrstack/spec.hpp>
#include <mrstack/spec_registry.hpp>

#include <cmath>
#include <filesystem>
#include <string>

#include <unistd.h>

#include <probe_resource.hpp>

using namespace mrstack;
using mrstack::test::probe_resource;

namespace {

void register_review_probe() {
  static bool const once = [] {
    register_resource({"review_probe", "test layer", needs_upstream,
                       {size_param("size", optional_param, "a size"), number_param("ratio", optional_param, "a number")},
                       [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                         return std::make_shared<probe_resource>("review_probe", std::move(up), a);
                       }});
    return true;
  }();
  (void)once;
}

/// The spec must fail at check with `column` and a message containing `what`.
void require_check_error(std::string const& spec, std::size_t column, std::string const& what) {
  register_review_probe();
  INFO("spec: " << spec);
  try {
    check_stack_spec(parse_stack_spec(spec));
    FAIL("no error for a bad spec");
  } catch (spec_error const& e) {
    INFO("message:\n" << e.what());
    CHECK(e.column() == column);
    CHECK_THAT(std::string{e.what()}, Catch::Contains(what));
  }
}

}  // namespace

TEST_CASE("spec review: to_string quotes a positional value that would read back as name=value") {
  // Quoted, these are positional values; written back bare they became named arguments
  // (`review_probe(size=1KiB)`), so a tool's rewrite changed what the spec said.
  auto const spec = parse_stack_spec(R"(review_probe("size=1KiB", "x = y") > simulated)");
  REQUIRE(spec.layers[0].arguments.size() == 2);
  CHECK(spec.layers[0].arguments[0].name.empty());
  std::string const text = to_string(spec);
  INFO(text);
  auto const back = parse_stack_spec(text);
  REQUIRE(back.layers[0].arguments.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(back.layers[0].arguments[i].name.empty());
    CHECK(back.layers[0].arguments[i].value == spec.layers[0].arguments[i].value);
  }
  // Read back, it still means what it said: the text "size=1KiB" is no size.
  register_review_probe();
  CHECK_THROWS_WITH(check_stack_spec(back), Catch::Contains("bad value 'size=1KiB' for review_probe's size"));
  // A named value holding '=' needs no quotes: it reads back as the same value.
  CHECK(to_string(parse_stack_spec("review_probe(size=a=b) > simulated")) == "review_probe(size=a=b) > simulated");
}

TEST_CASE("spec review: a device ordinal past int's range is refused, not wrapped to another device") {
  // 2^32 became device 0 and 2^32 - 1 became -1 ("the current device") when cast to int.
  for (char const* bottom : {"cuda", "cuda_async", "managed", "pinned_host"}) {
    std::string const name{bottom};
    require_check_error(name + "(device=4294967296)", name.size() + 9, "out of range");
    require_check_error(name + "(device=4294967295)", name.size() + 9, "out of range");
  }
}

TEST_CASE("spec review: a number must be finite") {
  require_check_error("review_probe(ratio=nan) > simulated", 20, "expected a finite number");
  require_check_error("review_probe(ratio=-inf) > simulated", 20, "expected a finite number");
  require_check_error("review_probe(ratio=infinity) > simulated", 20, "expected a finite number");
  register_review_probe();
  auto const top = build_stack(parse_stack_spec("review_probe(ratio=1e308) > simulated"));
  auto const* probe = dynamic_cast<probe_resource const*>(top.get());
  REQUIRE(probe != nullptr);
  CHECK(probe->args.number("ratio") == 1e308);
}

TEST_CASE("spec review: a combination error points at its value when a bare flag stands before it") {
  // The flag's bare name takes no position, so 2GiB is `initial` and 1GiB is `max`: the
  // caret belongs under 2GiB, not under the flag.
  require_check_error("pool(consolidate_on_growth, 2GiB, 1GiB) > simulated", 29, "initial 2GiB exceeds max 1GiB");
}

TEST_CASE("spec review: two logging layers of one stack writing one file are refused at the second") {
  // Each truncated the file as it was built, then both wrote their rows into it: a log
  // with one address allocated twice, which no replay accepts.
  auto const dir = std::filesystem::temp_directory_path() / ("mrstack_spec_review_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string const file = (dir / "twice.csv").string();
  std::string const spec = "logging(" + file + ") > pool > logging(file=" + file + ", async) > simulated";
  require_check_error(spec, spec.find("file=") + 6, "logging writes file '" + file + "', as the logging layer at column 1 does");
  // Another spelling of the same path is the same file.
  std::string const dotted = (dir / "." / "twice.csv").string();
  require_check_error("logging(" + file + ") > logging(" + dotted + ") > simulated", file.size() + 21,
                      "as the logging layer at column 1 does");
  // Neither names a file: both write the default one ($MRSTACK_LOG_FILE).
  require_check_error("logging > statistics > logging(async) > simulated", 24, "logging writes its default file");
  CHECK_FALSE(std::filesystem::exists(file));
  // Two files are fine.
  CHECK_NOTHROW(check_stack_spec(parse_stack_spec("logging(" + file + ") > logging(" + file + ".2) > simulated")));
}

TEST_CASE("spec review: a character past ASCII is named with its code point, so an invisible one shows") {
  // A no-break space (pasted from a web page) was "found ' '", a zero-width space "found ''".
  require_check_error("pool\xC2\xA0> simulated", 5, "found '\xC2\xA0' (U+00A0)");
  require_check_error("pool \xE2\x80\x8B> simulated", 6, "found '\xE2\x80\x8B' (U+200B)");
  require_check_error("pool > \xF0\x9F\x98\x80", 8, "found '\xF0\x9F\x98\x80' (U+1F600)");
}
