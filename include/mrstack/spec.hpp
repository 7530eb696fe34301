#pragma once
/// Stack specs: one line of text describes a stack from top to bottom, for example
///   statistics > logging(file=alloc.csv) > limiting(8GiB) > pool(initial=1GiB, max=16GiB) > cuda
/// `make_stack` turns it into an owning stack (the top layer; each layer owns the one
/// below). The grammar and every resource's parameters are documented in docs/spec.md.
/// A bad spec throws `spec_error`, whose message quotes the spec, points at the column
/// and says what was expected.
#include <cstddef>
#include <string>
#include <string_view>

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

/// Builds the stack `spec` describes. Throws `spec_error` for a bad spec, and whatever the
/// resources' constructors throw (`cuda_error`, `out_of_memory`) when building it fails.
resource_ptr make_stack(std::string_view spec);

/// The stack named by the MRSTACK_RESOURCE environment variable, or `fallback` when it is unset.
resource_ptr make_stack_from_environment(std::string_view fallback = "cuda");

}  // namespace mrstack
