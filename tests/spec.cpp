// Stack specs: the parser (AST, columns, every syntax error), sizes, the builder (every
// semantic error, typed arguments, percentages, bottom-up building) and the environment.
#include <catch2/catch.hpp>

#include <mrstack/replay/footprint_meter.hpp>
#include <mrstack/spec.hpp>
#include <mrstack/spec_registry.hpp>
#include <mrstack/suballoc/arena_memory_resource.hpp>
#include <mrstack/suballoc/binning_memory_resource.hpp>
#include <mrstack/suballoc/fixed_size_memory_resource.hpp>
#include <mrstack/suballoc/pool_memory_resource.hpp>
#include <mrstack/upstream/simulated_memory_resource.hpp>
#include <mrstack/upstream/simulated_vmm_memory_resource.hpp>
#include <mrstack/upstream/system_memory_resource.hpp>

#include <cstdlib>
#include <filesystem>

#include <unistd.h>

#include <mrstack/log/allocation_log.hpp>
#include <random>

#include <cuda_runtime_api.h>

#include <probe_resource.hpp>

using namespace mrstack;
using mrstack::test::probe_resource;

namespace {

void register_probe() {
  static bool const once = [] {
    register_resource({"probe", "test layer", needs_upstream,
                       {size_param("size", optional_param, "a size"), count_param("count", optional_param, "a count"),
                        number_param("ratio", optional_param, "a number"), flag_param("enabled", optional_param, "a flag"),
                        text_param("file", optional_param, "a text")},
                       [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                         return std::make_shared<probe_resource>("probe", std::move(up), a);
                       }});
    register_resource({"probe_needs", "test layer with a required parameter", needs_upstream,
                       {size_param("limit", required, "bytes it may hand out")},
                       [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
                         return std::make_shared<probe_resource>("probe", std::move(up), a);
                       }});
    register_resource({"probe_refuses", "test layer whose constructor refuses", needs_upstream, {},
                       [](spec_arguments const&, resource_ptr) -> resource_ptr {
                         throw logic_error("initial must not exceed max");
                       }});
    return true;
  }();
  (void)once;
}

/// The spec must fail (at parse or at check) with `column` and a message containing `what`,
/// quoting the spec with a caret under the column.
void require_spec_error(std::string const& spec, std::size_t column, std::string const& what, bool build = false) {
  register_probe();
  INFO("spec: " << spec);
  try {
    auto const parsed = parse_stack_spec(spec);
    check_stack_spec(parsed);
    if (build) { (void)build_stack(parsed); }
    FAIL("no error for a bad spec");
  } catch (spec_error const& e) {
    std::string const message = e.what();
    INFO("message:\n" << message);
    CHECK(e.column() == column);
    CHECK_THAT(message, Catch::Contains(what));
    std::string const caret = "\n  " + spec + "\n  " + std::string(column - 1, ' ') + "^";
    CHECK_THAT(message, Catch::Contains(caret));
  }
}

probe_resource& probe_of(resource_ptr const& top) {
  auto* probe = dynamic_cast<probe_resource*>(top.get());
  REQUIRE(probe != nullptr);
  return *probe;
}

}  // namespace

TEST_CASE("spec: the AST keeps layers top to bottom, arguments and their columns") {
  auto const spec = parse_stack_spec("  statistics > logging(file=a.csv) >limiting( 8GiB ) > pool(initial=1GiB, max = 16GiB)>cuda");
  REQUIRE(spec.layers.size() == 5);
  CHECK(spec.layers[0].name == "statistics");
  CHECK(spec.layers[0].column == 3);
  CHECK(spec.layers[1].name == "logging");
  REQUIRE(spec.layers[1].arguments.size() == 1);
  CHECK(spec.layers[1].arguments[0].name == "file");
  CHECK(spec.layers[1].arguments[0].value == "a.csv");
  CHECK(spec.layers[1].arguments[0].name_column == 24);
  CHECK(spec.layers[1].arguments[0].value_column == 29);
  CHECK(spec.layers[2].arguments[0].name.empty());
  CHECK(spec.layers[2].arguments[0].value == "8GiB");
  CHECK(spec.layers[3].arguments[1].name == "max");
  CHECK(spec.layers[3].arguments[1].value == "16GiB");
  CHECK(spec.layers[4].name == "cuda");
  CHECK(spec.layers[4].arguments.empty());
  CHECK(to_string(spec) == "statistics > logging(file=a.csv) > limiting(8GiB) > pool(initial=1GiB, max=16GiB) > cuda");
}

TEST_CASE("spec: quoted values keep commas, parentheses and escapes, and print back quoted") {
  auto const spec = parse_stack_spec(R"(logging(file="a,b) \"c\".csv", x=plain value) > cuda())");
  REQUIRE(spec.layers[0].arguments.size() == 2);
  CHECK(spec.layers[0].arguments[0].value == "a,b) \"c\".csv");
  CHECK(spec.layers[0].arguments[1].value == "plain value");
  CHECK(spec.layers[1].arguments.empty());
  auto const again = parse_stack_spec(to_string(spec));
  CHECK(again.layers[0].arguments[0].value == spec.layers[0].arguments[0].value);
  CHECK(to_string(again) == to_string(spec));
}

TEST_CASE("spec: to_string round-trips random ASTs") {
  std::mt19937 rng{42};
  std::string const alphabet = "ab_9 ,()\"\\>=%.";
  for (int round = 0; round < 5000; ++round) {
    stack_spec spec;
    int const layers = 1 + static_cast<int>(rng() % 4);
    for (int l = 0; l < layers; ++l) {
      spec_layer layer;
      layer.name = std::string{"layer_"}.append(std::to_string(rng() % 100));
      int const args = static_cast<int>(rng() % 4);
      for (int a = 0; a < args; ++a) {
        spec_argument arg;
        // Some positional: a value with '=' must come back a value, not a name.
        if (rng() % 3 != 0) { arg.name = std::string{"p"}.append(std::to_string(a)); }
        int const len = static_cast<int>(rng() % 8);
        for (int c = 0; c < len; ++c) { arg.value += alphabet[rng() % alphabet.size()]; }
        layer.arguments.push_back(arg);
      }
      spec.layers.push_back(layer);
    }
    std::string const text = to_string(spec);
    INFO(text);
    auto const back = parse_stack_spec(text);
    REQUIRE(back.layers.size() == spec.layers.size());
    for (std::size_t l = 0; l < spec.layers.size(); ++l) {
      REQUIRE(back.layers[l].arguments.size() == spec.layers[l].arguments.size());
      for (std::size_t a = 0; a < spec.layers[l].arguments.size(); ++a) {
        CHECK(back.layers[l].arguments[a].value == spec.layers[l].arguments[a].value);
        CHECK(back.layers[l].arguments[a].name == spec.layers[l].arguments[a].name);
      }
    }
  }
}

TEST_CASE("spec: sizes") {
  CHECK(parse_size("4096") == 4096u);
  CHECK(parse_size("0") == 0u);
  CHECK(parse_size("12B") == 12u);
  CHECK(parse_size("64KiB") == 64u * 1024);
  CHECK(parse_size("64kib") == 64u * 1024);
  CHECK(parse_size("2 MiB") == 2u << 20);
  CHECK(parse_size("1.5GiB") == 3ull << 29);
  CHECK(parse_size("1TiB") == 1ull << 40);
  CHECK(parse_size("2KB") == 2000u);
  CHECK(parse_size("3MB") == 3000000u);
  CHECK(parse_size("1GB") == 1000000000u);
  CHECK(parse_size("1TB") == 1000000000000u);
  CHECK(parse_size("0.1KiB") == 102u);  // fractions round down to whole bytes
  // Exact decimal fractions are exact bytes (a binary float lost one: 49, 719, 0, 255, 1000).
  CHECK(parse_size("0.05KB") == 50u);
  CHECK(parse_size("0.72KB") == 720u);
  CHECK(parse_size("0.001KB") == 1u);
  CHECK(parse_size("0.256KB") == 256u);
  CHECK(parse_size("1.001KB") == 1001u);
  CHECK(parse_size("0.3TB") == 300000000000u);
  CHECK(parse_size("0.999999999999999999999999999999KB") == 999u);
  CHECK(parse_size("1.0000000000000000000000000000001KiB") == 1024u);
  // Digits past the 25th are ignored, however many there are (they once overflowed the
  // 128-bit sums: wrong sizes at 38 digits, a division by zero past ~154).
  CHECK(parse_size("0.5" + std::string(39, '0') + "KiB") == 512u);
  CHECK(parse_size("0." + std::string(40, '9') + "KiB") == 1023u);
  CHECK(parse_size("1." + std::string(40, '0') + "1GiB") == 1ull << 30);
  CHECK(parse_size("0." + std::string(200, '9') + "TiB") == (1ull << 40) - 1);
  CHECK(parse_size("3." + std::string(200, '5') + "B") == 3u);
  CHECK(parse_size("16777215.999TiB") == (std::size_t{16777215} << 40) + (std::size_t{999} << 40) / 1000);
  std::string why;
  CHECK_FALSE(parse_size("", &why));
  CHECK_THAT(why, Catch::Contains("expected a size"));
  CHECK_FALSE(parse_size("-1GiB", &why));
  CHECK_THAT(why, Catch::Contains("negative"));
  CHECK_FALSE(parse_size("GiB", &why));
  CHECK_THAT(why, Catch::Contains("expected a number"));
  CHECK_FALSE(parse_size("4G", &why));
  CHECK_THAT(why, Catch::Contains("ambiguous: write GiB (powers of 1024) or GB"));
  CHECK_FALSE(parse_size("4 furlongs", &why));
  CHECK_THAT(why, Catch::Contains("unknown unit 'furlongs'"));
  CHECK_FALSE(parse_size("99999999999TiB", &why));
  CHECK_THAT(why, Catch::Contains("too large"));
  CHECK_FALSE(parse_size("99999999999999999999999", &why));
  CHECK_THAT(why, Catch::Contains("too large"));
}

TEST_CASE("spec: syntax errors point at the column and say what was expected") {
  require_spec_error("", 1, "the spec is empty");
  require_spec_error("   ", 4, "the spec is empty");
  require_spec_error("pool >", 7, "expected a resource name after '>'");
  require_spec_error("pool > > cuda", 8, "expected a resource name (letters, digits and '_'), found '>'");
  require_spec_error("> cuda", 1, "expected a resource name");
  require_spec_error("9pool > cuda", 1, "expected a resource name");
  require_spec_error("pool cuda", 6, "expected '>' (then the layer below) or the end of the spec after layer 'pool', found 'c'");
  require_spec_error("cuda )", 6, "found ')'");
  require_spec_error("cuda(", 6, "the '(' of cuda at column 5 is never closed: expected an argument or ')'");
  require_spec_error("pool(initial=1GiB > cuda", 25, "the '(' of pool at column 5 is never closed: expected ',' or ')'");
  require_spec_error("pool(initial=) > cuda", 14, "expected a value for initial before ')'");
  require_spec_error("pool(,) > cuda", 6, "expected an argument before ','");
  require_spec_error("pool(initial=1GiB,) > cuda", 19, "expected an argument before ')'");
  require_spec_error("pool(initial=", 14, "expected a value for initial in pool(...)");
  require_spec_error("pool(max=2GiB, 1GiB) > cuda", 16, "a positional argument cannot follow a named one");
  require_spec_error("logging(file=\"a.csv) > cuda", 14, "this quoted value is never closed");
  require_spec_error("logging(file=\"a.csv\" x) > cuda", 22, "expected ',' or ')' after the value, found 'x'");
  // A malformed name is not a value (the log went to a file named 'queue-capacity=1024').
  require_spec_error("logging(queue-capacity=1024, async) > system", 9,
                     "'queue-capacity' is not a parameter name (names are letters, digits and '_': queue_capacity?)");
  require_spec_error("logging(=x.csv) > system", 9, "a parameter name is missing before '='");
  require_spec_error("pool(min-growth=1MiB) > cuda", 6, "'min-growth' is not a parameter name");
  CHECK_NOTHROW(check_stack_spec(parse_stack_spec("logging(\"a=b.csv\") > system")));  // quoted: a value
}

TEST_CASE("spec: a UTF-8 character is named as itself, and the caret stands under its character") {
  // 'ó' was "a control character", and each multi-byte character before the error moved
  // the caret one place right per extra byte.
  try {
    (void)parse_stack_spec("po\xC3\xB3l > cuda");
    FAIL("expected a spec_error");
  } catch (spec_error const& e) {
    CHECK(e.column() == 3);
    CHECK_THAT(e.what(), Catch::Contains("found '\xC3\xB3'"));
  }
  try {
    check_stack_spec(parse_stack_spec("logging(file=donn\xC3\xA9""es.csv, bogus=1) > system"));
    FAIL("expected a spec_error");
  } catch (spec_error const& e) {
    std::string const what = e.what();
    CHECK(e.column() == 28);  // bytes
    // One place per character: 'bogus' is the 27th character.
    CHECK_THAT(what, Catch::Contains("\n  " + std::string(26, ' ') + "^"));
  }
  CHECK_THROWS_WITH(parse_stack_spec("po\xFFl > cuda"), Catch::Contains("byte 0xff, which is not UTF-8"));
  // Line breaks between tokens are shown as spaces, so the caret lines up on one line.
  try {
    (void)parse_stack_spec("pool >\n cuda x");
    FAIL("expected a spec_error");
  } catch (spec_error const& e) {
    CHECK_THAT(e.what(), Catch::Contains("\n  pool >  cuda x\n               ^"));
  }
}

TEST_CASE("spec: unknown resources and parameters list the valid names") {
  require_spec_error("pol > cuda", 1, "unknown resource 'pol'");
  require_spec_error("probe > cdua", 9, "unknown resource 'cdua' (did you mean 'cuda'?); expected one of: ");
  require_spec_error("probe > cdua", 9, "cuda, cuda_async");
  require_spec_error("probe(sise=1GiB) > cuda", 7,
                     "unknown parameter 'sise' for probe (did you mean 'size'?); expected size, count, ratio, enabled or file");
  require_spec_error("system(x=1)", 8, "unknown parameter 'x' for system: system takes no parameters");
  require_spec_error("cuda(x=1)", 6, "unknown parameter 'x' for cuda; expected device or peer_access");
  require_spec_error("system(1)", 8, "system takes no arguments");
  require_spec_error("simulated(1GiB, 2GiB)", 17, "too many positional arguments for simulated: it takes capacity");
}

TEST_CASE("spec: duplicate parameters, by name or by position, are errors at the second") {
  require_spec_error("probe(size=1GiB, size=2GiB) > cuda", 18, "parameter 'size' of probe is given twice (first at column 7)");
  require_spec_error("simulated(1GiB, capacity=2GiB)", 17, "parameter 'capacity' of simulated is given twice (first at column 11)");
}

TEST_CASE("spec: the shape of the stack: missing upstream, upstream under a bottom resource") {
  require_spec_error("probe", 6, "probe needs an upstream below it: expected '> ' and a resource, for example 'probe > cuda'");
  require_spec_error("probe", 6, "bottom resources: cuda, cuda_async, managed, pinned_host, simulated, simulated_vmm, system or vmm");
  require_spec_error("probe > probe(size=1)", 22, "probe needs an upstream below it");
  require_spec_error("cuda > probe > cuda", 8,
                     "'probe' is given as the upstream of cuda, but cuda is a bottom resource (it takes its memory from the "
                     "system): end the stack at cuda");
  require_spec_error("probe > simulated > system", 21, "upstream of simulated");
}

TEST_CASE("spec: bad values name the parameter, its type and what was expected") {
  require_spec_error("probe(size=lots) > cuda", 12, "bad value 'lots' for probe's size (a size): expected a number");
  require_spec_error("probe(size=4G) > cuda", 12, "ambiguous");
  require_spec_error("probe(size=-4GiB) > cuda", 12, "negative");
  require_spec_error("probe(size=0%) > cuda", 12, "more than 0% and at most 100%");
  require_spec_error("probe(size=150%) > cuda", 12, "at most 100%");
  require_spec_error("probe(size=x%) > cuda", 12, "expected a percentage such as 50%");
  require_spec_error("probe(count=1.5) > cuda", 13, "probe's count (a count): expected a whole number");
  require_spec_error("probe(count=99999999999999999999999) > cuda", 13, "too large");
  require_spec_error("probe(ratio=half) > cuda", 13, "expected a number such as 0.5");
  require_spec_error("probe(enabled=maybe) > cuda", 15, "expected true or false");
  require_spec_error("probe_needs > cuda", 1, "probe_needs needs its parameter 'limit' (bytes it may hand out), for example probe_needs(limit=1GiB)");
}

TEST_CASE("spec: the builder passes typed values and builds bottom-up") {
  register_probe();
  auto const top = make_stack("probe(1.5KiB, count=7, ratio=0.25, enabled=off, file=\"x, y.csv\") > footprint_meter > system");
  auto& probe = probe_of(top);
  CHECK(probe.args.size("size") == 1536u);
  CHECK(probe.args.count("count") == 7u);
  CHECK(probe.args.number("ratio") == 0.25);
  CHECK(probe.args.flag("enabled") == false);
  CHECK(probe.args.text("file") == "x, y.csv");
  CHECK_FALSE(probe.args.has("missing"));
  CHECK(describe_stack(*top) == "probe > footprint_meter > system");
  CHECK(dynamic_cast<footprint_meter*>(top->upstream()) != nullptr);
  CHECK(dynamic_cast<system_memory_resource*>(top->upstream()->upstream()) != nullptr);
  void* p = top->allocate(1000);
  CHECK(dynamic_cast<footprint_meter*>(top->upstream())->bytes_held() == 1000);
  top->deallocate(p, 1000);
}

TEST_CASE("spec: percentages are shares of the option, the simulated capacity, or the device") {
  register_probe();
  build_options options;
  options.percent_base = 1000;
  auto const a = build_stack(parse_stack_spec("probe(size=50%) > simulated"), options);
  CHECK(probe_of(a).args.size("size") == 500u);
  auto const b = make_stack("probe(size=12.5%) > simulated(capacity=1GiB)");
  CHECK(probe_of(b).args.size("size") == (1u << 27));
  auto const c = make_stack("probe(size=25%) > simulated(1GiB)");
  CHECK(probe_of(c).args.size("size") == (1u << 28));
  // With the option set, the capacity itself may be a percentage.
  auto const d = build_stack(parse_stack_spec("probe(size=50%) > simulated(capacity=50%)"), options);
  CHECK(probe_of(d).args.size("size") == 500u);
  CHECK(dynamic_cast<simulated_memory_resource*>(d->upstream())->capacity() == 500u);

  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  bool const have_device = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
  (void)cudaGetLastError();
  if (have_device) {
    auto const e = make_stack("probe(size=10%) > simulated");
    CHECK(probe_of(e).args.size("size") > 0u);
  } else {
    require_spec_error("probe(size=10%) > simulated", 12,
                       "'10%' is a share of the device's free memory, but there is no usable CUDA device", true);
    require_spec_error("probe(size=10%) > simulated", 12, "give simulated an absolute capacity", true);
    require_spec_error("probe(size=10%) > system", 12, "build the stack over simulated(capacity=...)", true);
    // check_stack_spec checks the syntax of percentages only: no device needed.
    CHECK_NOTHROW(check_stack_spec(parse_stack_spec("probe(size=10%) > simulated")));
  }
}

TEST_CASE("spec: the check finds what the build would, with percentages left unresolved") {
  // vmm's ipc was first refused by the constructor, so never under --simulate.
  require_spec_error("pool > vmm(ipc=bogus)", 16, "ipc=bogus is none of auto, none, fd, fabric");
  // arena's size is 50% by default: its combination check was skipped until the build.
  // The parameter at fault kept its default: the error points at the one written (it was column 1).
  require_spec_error("arena(superblock_size=64KiB) > cuda", 23, "at most half the superblock (64KiB)");
  require_spec_error("arena(size=10%, superblock_size=64KiB) > cuda", 33, "at most half the superblock");
  // A percentage is only checked for syntax: the combinations it takes part in wait for the build.
  CHECK_NOTHROW(check_stack_spec(parse_stack_spec("pool(initial=50%, max=1GiB) > cuda")));
  CHECK_NOTHROW(check_stack_spec(parse_stack_spec("binning(min=1KiB, max=1%) > cuda")));
}

TEST_CASE("spec: a constructor's logic_error becomes a spec_error at that layer") {
  register_probe();
  try {
    (void)make_stack("probe > probe_refuses > system");
    FAIL("built");
  } catch (spec_error const& e) {
    CHECK(e.column() == 9);
    CHECK_THAT(e.what(), Catch::Contains("probe_refuses refused its arguments: initial must not exceed max"));
  }
}

TEST_CASE("spec: a tool can rewrite the AST: replace the bottom, insert a layer") {
  register_probe();
  auto spec = parse_stack_spec("probe(size=1KiB) > cuda");
  spec.layers.back() = spec_layer{"simulated", {spec_argument{"capacity", "1MiB", 0, 0}}, 0};
  spec.layers.insert(spec.layers.end() - 1, spec_layer{"footprint_meter", {}, 0});
  CHECK(to_string(spec) == "probe(size=1KiB) > footprint_meter > simulated(capacity=1MiB)");
  auto const top = build_stack(spec);
  CHECK(describe_stack(*top) == "probe > footprint_meter > simulated");
  // An error in a part the tool added has no column in the user's text, and says so.
  spec.layers.back().arguments[0].value = "lots";
  try {
    (void)build_stack(spec);
    FAIL("built");
  } catch (spec_error const& e) {
    CHECK(e.column() == 0);
    CHECK_THAT(e.what(), Catch::Contains("a part of the spec a tool added"));
  }
}

TEST_CASE("spec: the registry refuses duplicates and lists every resource sorted") {
  register_probe();
  CHECK_THROWS_WITH(register_resource({"cuda", "again", bottom_resource, {},
                                       [](spec_arguments const&, resource_ptr) -> resource_ptr { return nullptr; }}),
                    Catch::Contains("'cuda' is already registered"));
  auto const all = registered_resources();
  REQUIRE(all.size() >= 7);
  for (std::size_t i = 1; i < all.size(); ++i) { CHECK(all[i - 1]->name < all[i]->name); }
  for (char const* name : {"cuda", "cuda_async", "managed", "pinned_host", "system", "simulated", "footprint_meter",
                           "pool", "fixed_size", "binning", "arena", "vmm", "simulated_vmm", "logging", "limiting",
                           "tracking", "statistics", "thread_safe", "aligned", "retry"}) {
    CHECK(find_resource(name) != nullptr);
  }
  CHECK(find_resource("simulated")->capacity_parameter == "capacity");
}

TEST_CASE("spec: the registry refuses an entry no spec could use") {
  // Each was accepted, and every use then failed at the user's spec.
  auto const make = [](spec_arguments const&, resource_ptr) -> resource_ptr { return nullptr; };
  auto entry = [&](std::string name, std::vector<spec_parameter> params) {
    return spec_resource{std::move(name), "a test entry", upstream_rule::required, std::move(params), make};
  };
  CHECK_THROWS_WITH(register_resource(entry("my-res", {})), Catch::Contains("not a name a spec can write"));
  CHECK_THROWS_WITH(register_resource(entry("odd_param", {size_param("a b", optional_param, "doc", "1")})),
                    Catch::Contains("parameter 'a b' is not a name a spec can write"));
  CHECK_THROWS_WITH(register_resource(entry("twice", {count_param("n", optional_param, "doc", "1"),
                                                      count_param("n", optional_param, "doc", "2")})),
                    Catch::Contains("parameter 'n' is listed twice"));
  CHECK_THROWS_WITH(register_resource(entry("empty_range", {count_param("n", optional_param, "doc", "1").within(10, 5)})),
                    Catch::Contains("range is empty (min 10 > max 5)"));
  auto bad_default = size_param("size", optional_param, "doc", "lots");
  bad_default.default_is_value = true;
  CHECK_THROWS_WITH(register_resource(entry("bad_default", {bad_default})),
                    Catch::Contains("default in spec syntax, 'lots', that its type refuses"));
  for (char const* name : {"my-res", "odd_param", "twice", "empty_range", "bad_default"}) {
    CHECK(find_resource(name) == nullptr);
  }
}

TEST_CASE("spec: MRSTACK_RESOURCE picks the stack; its errors name the variable") {
  ::setenv("MRSTACK_RESOURCE", "footprint_meter > simulated(capacity=1MiB)", 1);
  auto const top = make_stack_from_environment();
  CHECK(describe_stack(*top) == "footprint_meter > simulated");
  ::setenv("MRSTACK_RESOURCE", "footprint_meter > simulted", 1);
  try {
    (void)make_stack_from_environment();
    FAIL("built");
  } catch (spec_error const& e) {
    CHECK(e.column() == 19);
    CHECK_THAT(e.what(), Catch::StartsWith("MRSTACK_RESOURCE: bad stack spec at column 19: unknown resource 'simulted' "
                                           "(did you mean 'simulated'?)"));
  }
  ::unsetenv("MRSTACK_RESOURCE");
  CHECK(describe_stack(*make_stack_from_environment("simulated")) == "simulated");
}

TEST_CASE("spec: suballocators take every parameter by name; defaults in spec syntax resolve like written ones") {
  auto const pool = make_stack("pool(initial=1MiB, max=1GiB, growth_divisor=4, minimum_growth=8MiB, "
                               "growth_granularity=4MiB, consolidate_on_growth=off) > simulated");
  auto* p = dynamic_cast<pool_memory_resource*>(pool.get());
  REQUIRE(p != nullptr);
  CHECK(p->pool_size() == (1u << 20));
  auto const arena = make_stack("arena > simulated(capacity=1GiB)");  // size defaults to 50% of the capacity
  auto* a = dynamic_cast<arena_memory_resource*>(arena.get());
  REQUIRE(a != nullptr);
  CHECK(a->arena_size() == (512u << 20));
  auto const sized = make_stack("arena(size=64MiB, superblock_size=1MiB, max_small_size=256KiB, "
                                "empty_superblocks_kept=1) > simulated");
  CHECK(dynamic_cast<arena_memory_resource*>(sized.get())->arena_size() == (64u << 20));
  auto const bins = make_stack("binning(min=1KiB, max=8KiB) > pool > simulated");
  auto* b = dynamic_cast<binning_memory_resource*>(bins.get());
  REQUIRE(b != nullptr);
  void* x = b->allocate(3000);
  b->deallocate(x, 3000);
  CHECK(describe_stack(*make_stack("binning > pool > simulated")) == "binning > pool > simulated");
  auto const fixed = make_stack("fixed_size(block_size=4KiB, blocks_to_preallocate=16) > simulated");
  CHECK(dynamic_cast<fixed_size_memory_resource*>(fixed.get())->block_size() == 4096u);
  // A constructor's refusal points at its layer.
  require_spec_error("pool(initial=2GiB, max=1GiB) > simulated", 14, "bad arguments for pool: initial 2GiB exceeds max 1GiB");
  require_spec_error("arena(superblock_size=3MiB) > simulated(capacity=1GiB)", 23,
                     "3MiB is out of range: expected 64KiB to 16MiB, a power of two");
  require_spec_error("pool(growth_divisor=half) > cuda", 21, "bad value 'half' for pool's growth_divisor (a count)");
  // The pool grows in place directly over a virtual range; its options by name.
  auto const grown = make_stack("pool(release_threshold=64MiB, grow_in_place=true) > "
                                "simulated_vmm(capacity=1GiB, reserve=4GiB, granularity=2MiB, map_granules=1)");
  void* big = grown->allocate(100u << 20);
  auto* range = dynamic_cast<simulated_vmm_memory_resource*>(grown->upstream());
  REQUIRE(range != nullptr);
  CHECK(range->committed_bytes() >= (100u << 20));
  CHECK(range->capacity() == (1u << 30));
  grown->deallocate(big, 100u << 20);
  CHECK(find_resource("vmm")->simulation_twin == "simulated_vmm");
  CHECK(find_resource("simulated_vmm")->is_simulation);
}

TEST_CASE("spec: the adaptors take every parameter by name") {
  auto const dir = std::filesystem::temp_directory_path() / ("mrstack_spec_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto const file = (dir / "a, b.csv").string();
  {
    auto const top = make_stack("statistics > logging(file=\"" + file + "\", auto_flush=true, async=true, "
                                "queue_capacity=1024) > limiting(8KiB, granularity=1KiB) > tracking(capture_stacks=false, "
                                "report_leaks=false) > thread_safe > aligned(alignment=4KiB, threshold=1KiB) > "
                                "retry(max_retries=2) > simulated");
    CHECK(describe_stack(*top) ==
          "statistics > logging > limiting > tracking > thread_safe > aligned > retry > simulated");
    void* p = top->allocate(1000);
    CHECK(detail::is_aligned(p, 1u << 10));
    CHECK_THROWS_AS(top->allocate(8u << 10), out_of_memory);  // the limit counts 1 KiB granules
    top->deallocate(p, 1000);
  }
  auto const log = read_allocation_log(file);  // what logging wrote replays
  CHECK(log.events.size() == 2);
  std::filesystem::remove_all(dir);
  require_spec_error("limiting > simulated", 1, "limiting needs its parameter 'limit'");
  require_spec_error("aligned(alignment=3KiB) > simulated", 19, "expected 1B to 1GiB, a power of two");
}

// ---- parameter ranges, depth, bare flags, decimal units ---------------------------------

TEST_CASE("spec: values outside a parameter's range are refused when the stack is built, at the value") {
  // Each would build and then fail or misbehave at its first use (or shift by 64 bits).
  require_spec_error("binning(min=18446744073709551614B) > simulated", 13,
                     "bad value '18446744073709551614B' for binning's min (a size): 18446744073709551614B is out of "
                     "range: expected 1B to 1GiB");
  require_spec_error("binning(max=18446744073709551615) > simulated", 13, "expected 1B to 1GiB");
  require_spec_error("binning(max=2TiB) > simulated", 13, "2TiB is out of range");
  require_spec_error("binning(min=64KiB, max=1KiB) > simulated", 24, "bad arguments for binning: max 1KiB is below min 64KiB");
  require_spec_error("pool(minimum_growth=1TiB) > simulated", 21,
                     "1TiB is out of range: expected at most 512GiB");
  require_spec_error("pool(initial=600GiB) > simulated", 14, "at most 512GiB");
  require_spec_error("pool(max=1PiB) > simulated", 10, "unknown unit");  // no PiB unit: parse error first
  require_spec_error("pool(max=300TiB) > simulated", 10, "expected 256B to 256TiB");
  require_spec_error("pool(growth_divisor=0) > simulated", 21, "0 is out of range: expected 1 to 1024");
  require_spec_error("pool(contention_window=2000000000) > simulated", 24, "out of range");
  auto const always = make_stack("pool(contention_window=0) > simulated");
  CHECK(dynamic_cast<pool_memory_resource&>(*always).options().contention_window == 0);
  require_spec_error("pool(park_minimum=2TiB) > simulated", 19, "out of range");
  auto const coarse = make_stack("pool(park_minimum=64MiB) > simulated");
  CHECK(dynamic_cast<pool_memory_resource&>(*coarse).options().park_minimum == std::size_t{64} << 20);
  require_spec_error("pool(growth_granularity=3MiB) > simulated", 25, "a power of two");
  require_spec_error("fixed_size(block_size=0) > simulated", 23, "expected 1B to 1GiB");
  require_spec_error("fixed_size(block_size=1GiB, blocks_to_preallocate=2048) > simulated", 51,
                     "2048 blocks of 1GiB make a chunk of more than 1TiB");
  require_spec_error("arena(size=1GiB, max_small_size=4MiB) > simulated", 33,
                     "at most half the superblock (4MiB)");
  require_spec_error("logging(file=x.csv, async=true, queue_capacity=100) > simulated", 48, "a power of two");
  require_spec_error("limiting(1GiB, granularity=0) > simulated", 28, "expected 1B to 1GiB, a power of two");
  require_spec_error("retry(max_retries=5000) > simulated", 19, "expected at most 1000");
  require_spec_error("simulated_vmm(granularity=100)", 27, "expected 256B to 1GiB, a power of two");
  // A percentage is checked once resolved.
  build_options options;
  options.percent_base = std::size_t{1} << 40;
  try {
    (void)build_stack(parse_stack_spec("pool(initial=100%) > simulated"), options);
    FAIL("built");
  } catch (spec_error const& e) {
    CHECK(e.column() == 14);
    CHECK_THAT(e.what(), Catch::Contains("1TiB (100% of 1099511627776 B) is out of range: expected at most 512GiB"));
  }
  // The edges of each range build.
  CHECK_NOTHROW(make_stack("binning(min=1B, max=1GiB) > simulated"));
  CHECK_NOTHROW(make_stack("pool(minimum_growth=512GiB, growth_divisor=1024, growth_granularity=1GiB) > simulated"));
  CHECK_NOTHROW(make_stack("retry(1000) > limiting(0, granularity=1) > simulated"));
}

TEST_CASE("spec: every range is stated, and says what it accepts") {
  auto const* pool = find_resource("pool");
  REQUIRE(pool != nullptr);
  std::size_t described = 0;
  for (auto const& p : pool->parameters) {
    if (p.name == "minimum_growth") { CHECK(describe_range(p) == "at most 512GiB"); }
    if (p.name == "growth_granularity") { CHECK(describe_range(p) == "256B to 1GiB, a power of two"); }
    if (p.name == "growth_divisor") { CHECK(describe_range(p) == "1 to 1024"); }
    if (!describe_range(p).empty()) { ++described; }
  }
  CHECK(described >= 5);
  CHECK(size_in_spec_units(1536) == "1536B");
  CHECK(size_in_spec_units(std::uint64_t{3} << 30) == "3GiB");
  CHECK(size_in_spec_units(0) == "0B");
}

TEST_CASE("spec: a stack deeper than max_stack_layers is refused at the first layer past the limit") {
  auto deep = [](std::size_t adaptors) {
    std::string spec;
    for (std::size_t i = 0; i < adaptors; ++i) { spec += "statistics > "; }
    return spec + "simulated";
  };
  // 63 adaptors + the bottom = 64 layers: builds and serves.
  auto const ok = make_stack(deep(max_stack_layers - 1));
  void* p = ok->allocate(512);
  ok->deallocate(p, 512);
  std::string const spec = deep(max_stack_layers);
  std::size_t const column = max_stack_layers * std::string{"statistics > "}.size() + 1;
  require_spec_error(spec, column, "the stack has 65 layers; at most 64 are allowed");
  // Far deeper stacks are refused as quickly, before any layer is looked up or built.
  std::string huge;
  for (int i = 0; i < 100000; ++i) { huge += "binning > "; }
  huge += "system";
  CHECK_THROWS_AS(make_stack(huge), spec_error);
}

TEST_CASE("spec: a flag may be written as its bare name, anywhere in the list") {
  register_probe();
  auto const a = make_stack("probe(size=1KiB, enabled) > simulated");
  CHECK(probe_of(a).args.flag("enabled") == true);
  CHECK(probe_of(a).args.size("size") == 1024u);
  auto const b = make_stack("probe(enabled, 2KiB) > simulated");  // the bare flag takes no position
  CHECK(probe_of(b).args.size("size") == 2048u);
  CHECK(probe_of(b).args.flag("enabled") == true);
  auto const tmp = std::filesystem::temp_directory_path() / ("mrstack_spec_flag_" + std::to_string(getpid()) + ".csv");
  auto const logging = make_stack("logging(file=" + tmp.string() + ", async) > simulated");
  void* p = logging->allocate(256);
  logging->deallocate(p, 256);
  std::filesystem::remove(tmp);
  require_spec_error("probe(enabled, enabled=false) > simulated", 16, "parameter 'enabled' of probe is given twice");
  // Any other positional value after a named one is still an error, at that value.
  require_spec_error("probe(size=1KiB, 7) > simulated", 18, "a positional argument cannot follow a named one");
}

TEST_CASE("spec: a decimal unit (GB) gives one note saying GB is 10^9 and GiB 2^30") {
  build_options options;
  std::vector<std::string> notes;
  options.on_note = [&](std::string const& note) { notes.push_back(note); };
  auto const top = build_stack(parse_stack_spec("pool(initial=1GB) > simulated"), options);
  CHECK(dynamic_cast<pool_memory_resource&>(*top).pool_size() >= 1000000000u);
  REQUIRE(notes.size() == 1);
  CHECK_THAT(notes[0], Catch::Contains("pool(initial=1GB is 1000000000 bytes: GB is 10^9 bytes, GiB is 2^30"));
  CHECK_THAT(notes[0], Catch::Contains("write GiB if that is what you meant"));
  notes.clear();
  (void)build_stack(parse_stack_spec("limiting(limit=512MB) > pool(minimum_growth=1KB) > simulated"), options);
  REQUIRE(notes.size() == 2);
  CHECK_THAT(notes[0], Catch::Contains("MB is 10^6 bytes, MiB is 2^20"));
  CHECK_THAT(notes[1], Catch::Contains("KB is 10^3 bytes, KiB is 2^10"));
  notes.clear();
  (void)build_stack(parse_stack_spec("pool(initial=1GiB, max=4000000000) > simulated"), options);
  CHECK(notes.empty());
  check_stack_spec(parse_stack_spec("pool(initial=1GB) > simulated"));  // checking alone says nothing
}
