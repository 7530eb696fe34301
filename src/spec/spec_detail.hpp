#pragma once
// Internal helpers shared by the spec parser, the builder and the registry (not installed).
#include <mrstack/spec.hpp>
#include <mrstack/spec_registry.hpp>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace mrstack::detail {

/// Throws `spec_error`: "<what>", then the spec quoted on its own line and a caret under
/// `column` (1-based; 0 = no column, when a tool added the offending part).
[[noreturn]] void throw_spec_error(std::string_view spec_text, std::size_t column, std::string const& what);

/// Whether `name` is one the spec syntax reads as a name: [A-Za-z_][A-Za-z0-9_]*.
bool is_spec_name(std::string_view name);

/// "a, b or c" for error messages.
std::string join_alternatives(std::vector<std::string> const& names);

/// The registered name closest to `name` (edit distance at most 2), or empty.
std::string closest_name(std::string_view name, std::vector<std::string> const& candidates);

/// The spec's text as errors quote it (written back when a tool built the AST).
std::string spec_text_for_errors(stack_spec const& spec);

/// How one layer's arguments are checked and converted (src/spec/arguments.cpp).
struct argument_checker {
  stack_spec const& spec;
  /// What a percentage in this stack is a share of; null when only checking (percentages
  /// are then checked for syntax and read as 0 bytes, their range unchecked).
  std::function<std::size_t(spec_argument const&)> percent_base;
  /// Where notes about probable slips go (decimal units); null: nowhere.
  std::function<void(std::string const&)> note;
  /// Set when any value of the layer was a percentage.
  bool saw_percentage = false;

  /// Matches the layer's arguments to the entry's parameters (by name, by position, or a
  /// flag's bare name), converts each value to its type and checks its range, applies
  /// spec-syntax defaults and refuses missing required ones. Throws spec_error.
  spec_arguments check(spec_layer const& layer, spec_resource const& entry);
};

/// The built-in entries (src/spec_resources.cpp): every resource mrstack ships.
std::vector<spec_resource> builtin_resources();

}  // namespace mrstack::detail
