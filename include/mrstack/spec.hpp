#pragma once
/// Stack specs: one line of text describes a stack from top to bottom, for example
///   statistics > logging(file=alloc.csv) > limiting(8GiB) > pool(initial=1GiB, max=16GiB) > cuda
/// `make_stack` turns it into an owning stack (the top layer; each layer owns the one
/// below). The grammar and every resource's parameters are documented in docs/spec.md.
/// A bad spec throws `spec_error`, whose message quotes the spec, points at the column
/// and says what was expected.
///
/// Two steps, both public so tools can rewrite a stack before building it:
/// - `parse_stack_spec` checks the syntax only and returns the AST (`stack_spec`: the
///   layers top to bottom, each a name and its arguments, with their columns);
/// - `build_stack` checks names, parameters and values against the registry
///   (mrstack/spec_registry.hpp) and builds bottom-up. `check_stack_spec` does the same
///   checks without building anything (no CUDA call, no allocation).
/// mrstack-replay, for example, replaces the bottom layer by `simulated` and inserts a
/// footprint meter above it, then builds the rewritten AST.
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <mrstack/error.hpp>
#include <mrstack/resource.hpp>

namespace mrstack {

class spec_error : public logic_error {
 public:
  spec_error(std::string const& message, std::size_t column) : logic_error{message}, column_{column} {}
  /// 1-based column of the offending token in the spec.
  [[nodiscard]] std::size_t column() const noexcept { return column_; }

 private:
  std::size_t column_;
};

/// One argument inside a layer's parentheses: `name=value`, or a positional `value`.
struct spec_argument {
  std::string name;              ///< empty for a positional argument
  std::string value;             ///< the value's text, quotes removed
  std::size_t name_column = 0;   ///< 1-based; 0 when a tool added it (it is not in the text)
  std::size_t value_column = 0;  ///< 1-based; 0 when a tool added it
};

/// One layer: a resource name and its arguments.
struct spec_layer {
  std::string name;
  std::vector<spec_argument> arguments;
  std::size_t column = 0;  ///< 1-based column of the name; 0 when a tool added the layer
};

/// The syntax tree of a spec: its layers from top to bottom.
struct stack_spec {
  std::string text;               ///< the text it was parsed from; errors quote it
  std::vector<spec_layer> layers; ///< top first, bottom last; never empty after parsing
};

/// Parses the syntax of `text` (names and parameters are not checked here; see
/// `check_stack_spec`). Throws `spec_error`.
stack_spec parse_stack_spec(std::string_view text);

/// The spec written back as text, in canonical form: `a(x=1) > b`. Values that would not
/// read back as themselves are quoted.
std::string to_string(stack_spec const& spec);

/// The most layers a stack spec may have. Every call walks the stack one C++ frame per
/// layer, so a stack thousands of layers deep overflows the thread's stack on its first
/// call; no useful stack has more than a dozen. A deeper spec is a `spec_error` at the
/// first layer past the limit.
inline constexpr std::size_t max_stack_layers = 64;

/// How to build a stack.
struct build_options {
  /// The memory a percentage (`size=50%`) is a share of. Unset: a `simulated` bottom with
  /// an absolute capacity, else the device's free memory (cudaMemGetInfo, asked once per
  /// build). mrstack-replay sets it to the simulated device's capacity.
  std::optional<std::size_t> percent_base;
  /// The device the stack is built for: the build runs with it current (its upstreams,
  /// events and percentages belong to it) and the caller's current device is left as it
  /// was. Unset: the device current on the calling thread.
  std::optional<int> device;
  /// Receives notes about a spec that builds but probably says something other than what
  /// was meant: a decimal unit (`1GB` is 10^9 bytes, not 2^30). Unset: the first such note
  /// of the process goes to stderr, later ones nowhere.
  std::function<void(std::string const& note)> on_note;
};

/// Checks every name, parameter and value of `spec` against the registry (each value in its
/// parameter's range, combinations through the entry's `validate`), the depth of the stack
/// (`max_stack_layers`) and its shape (an upstream below every layer that needs one, none
/// below a bottom resource), without building anything. Percentages are checked for syntax
/// only. Throws `spec_error`.
void check_stack_spec(stack_spec const& spec);
/// The same, but with `options.percent_base` set, percentages are resolved against it and
/// checked in range as `build_stack` would check them (mrstack-replay, before it reads the
/// log: a share out of its parameter's range was refused only once the stack was built).
/// The other options are not used.
void check_stack_spec(stack_spec const& spec, build_options const& options);

/// Builds the stack `spec` describes, bottom first. Throws `spec_error` for a bad spec
/// (including a resource constructor's `logic_error`, then pointing at that layer), and
/// passes on `cuda_error` and `out_of_memory` from the resources' constructors.
resource_ptr build_stack(stack_spec const& spec, build_options const& options = {});

/// Builds the stack `spec` describes: `build_stack(parse_stack_spec(spec))`.
resource_ptr make_stack(std::string_view spec);

/// The stack named by the MRSTACK_RESOURCE environment variable, or `fallback` when it is
/// unset or empty. A bad spec's error names the variable.
resource_ptr make_stack_from_environment(std::string_view fallback = "cuda");

/// Parses a size as a spec writes it: `4096`, `64KiB`, `1.5GiB`, `2GB`; units are
/// case-insensitive; KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000.
/// Percentages are not accepted here. Returns nullopt (and says why in `why`) when `text`
/// is not a size.
std::optional<std::size_t> parse_size(std::string_view text, std::string* why = nullptr);

}  // namespace mrstack
