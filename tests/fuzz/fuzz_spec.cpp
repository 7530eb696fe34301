// libFuzzer target: the stack-spec parser and builder. The input's first line is a spec;
// the rest drives a few allocations through the stack built from it.
//
// No CUDA is touched: the bottom layer is replaced by `simulated(capacity=64GiB)` (or kept
// as `simulated_vmm`, with that capacity), percentages are shares of 64 GiB
// (build_options::percent_base, so cudaMemGetInfo is never asked), and a `logging` layer
// writes to /dev/null whatever file the input names. Every spec must build or be refused
// with a spec_error (a bad spec); anything else is a finding. The text printed back by
// to_string must parse to the same layers.
#include <mrstack/spec.hpp>
#include <mrstack/spec_registry.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace {

void check(bool ok, char const* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_spec: invariant broken: %s\n", what);
    std::abort();
  }
}

/// The stack the fuzzer builds: the parsed spec with nothing that reaches the device or
/// the file system.
mrstack::stack_spec make_harmless(mrstack::stack_spec spec) {
  for (auto& layer : spec.layers) {
    if (layer.name != "logging") { continue; }
    std::vector<mrstack::spec_argument> kept;
    for (auto& arg : layer.arguments) {
      if (!arg.name.empty() && arg.name != "file") { kept.push_back(std::move(arg)); }
    }
    kept.push_back({"file", "/dev/null", 0, 0});
    layer.arguments = std::move(kept);
  }
  auto& bottom = spec.layers.back();
  if (bottom.name != "simulated_vmm") { bottom.name = "simulated"; }
  bottom.arguments = {{"capacity", "64GiB", 0, 0}};
  return spec;
}

void exercise(mrstack::memory_resource& top, std::string_view script) {
  std::vector<std::pair<void*, std::size_t>> live;
  for (std::size_t i = 0; i + 1 < script.size() && i < 64; i += 2) {
    auto const a = static_cast<unsigned char>(script[i]);
    auto const b = static_cast<unsigned char>(script[i + 1]);
    if ((a & 1) == 0 || live.empty()) {
      std::size_t const bytes = (std::size_t{b} + 1) << (a >> 3);  // 1 B .. 8 MiB
      try {
        if (void* p = top.allocate(bytes)) { live.emplace_back(p, bytes); }
      } catch (mrstack::out_of_memory const&) {
      } catch (mrstack::logic_error const&) {  // a layer that refuses this size (fixed_size, limits)
      }
    } else {
      auto const at = b % live.size();
      top.deallocate(live[at].first, live[at].second);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(at));
    }
  }
  for (auto const& [p, bytes] : live) { top.deallocate(p, bytes); }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  std::string_view const input{reinterpret_cast<char const*>(data), size};
  auto const newline = input.find('\n');
  std::string_view const text = input.substr(0, newline);
  std::string_view const script = newline == std::string_view::npos ? std::string_view{} : input.substr(newline + 1);
  mrstack::stack_spec parsed;
  try {
    parsed = mrstack::parse_stack_spec(text);
  } catch (mrstack::spec_error const&) {
    return 0;
  }
  check(!parsed.layers.empty(), "a parsed spec has layers");
  auto const again = mrstack::parse_stack_spec(mrstack::to_string(parsed));  // must not throw
  check(again.layers.size() == parsed.layers.size(), "to_string round-trips the layers");
  try {
    mrstack::check_stack_spec(parsed);
  } catch (mrstack::spec_error const&) {
  }
  mrstack::build_options options;
  options.percent_base = std::size_t{64} << 30;
  options.on_note = [](std::string const&) {};
  mrstack::resource_ptr top;
  try {
    top = mrstack::build_stack(make_harmless(std::move(parsed)), options);
  } catch (mrstack::spec_error const&) {
    return 0;
  } catch (mrstack::out_of_memory const&) {  // a constructor that takes memory up front (arena, pool initial)
    return 0;
  }
  exercise(*top, script);
  return 0;
}
