#pragma once
// Internal helpers shared by the spec parser, the builder and the registry (not installed).
#include <mrstack/spec.hpp>
#include <mrstack/spec_registry.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace mrstack::detail {

/// Throws `spec_error`: "<what>", then the spec quoted on its own line and a caret under
/// `column` (1-based; 0 = no column, when a tool added the offending part).
[[noreturn]] void throw_spec_error(std::string_view spec_text, std::size_t column, std::string const& what);

/// "a, b or c" for error messages.
std::string join_alternatives(std::vector<std::string> const& names);

/// The registered name closest to `name` (edit distance at most 2), or empty.
std::string closest_name(std::string_view name, std::vector<std::string> const& candidates);

/// The built-in entries (src/spec_resources.cpp): every resource mrstack ships.
std::vector<spec_resource> builtin_resources();

}  // namespace mrstack::detail
