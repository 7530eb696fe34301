#pragma once
/// The registry of resources a stack spec can name: for each, its parameters (name, type,
/// default, one line of documentation) and a function that builds it over its upstream.
///
/// Adding a resource is one entry (see src/spec/resources.cpp for the built-in ones):
///
///   {"limiting", "refuses allocations past a byte limit", needs_upstream,
///    {size_param("limit", required, "bytes it may hand out at once")},
///    [](spec_arguments const& a, resource_ptr up) -> resource_ptr {
///      return std::make_shared<limiting_resource_adaptor>(std::move(up), *a.size("limit"));
///    }}
///
/// The builder checks every argument against the entry before `make` is called — unknown,
/// duplicate, missing, badly typed and out-of-range values are `spec_error`s pointing at
/// the text — so `make` only reads typed values in their ranges. A parameter states its
/// range with `.within(min, max)` and `.power_of_two()`; an entry checks combinations
/// (min <= max, ...) in its `validate`, which throws `spec_parameter_error`. Positional
/// arguments fill the parameters in the order the entry lists them; a flag may also be
/// written as its bare name anywhere (`logging(file=x, async)`). `register_resource`
/// adds entries at run time (tests, plugins).
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <mrstack/resource.hpp>

namespace mrstack {

/// The type of a parameter's value, as the spec writes it.
enum class param_type {
  size,    ///< bytes: 4096, 64KiB, 1.5GiB, 2GB, or a percentage 50% (see build_options)
  count,   ///< a non-negative integer: 4, 1000
  number,  ///< a real number: 0.5, 2
  flag,    ///< true/false, yes/no, on/off, 1/0
  text,    ///< any text (quote it to include ',' or ')')
};
char const* to_string(param_type type) noexcept;

/// The values a size or count parameter accepts, checked when a stack is built (before any
/// constructor runs); `mrstack-replay --list-resources` prints it. A percentage is
/// checked once resolved to bytes.
struct param_range {
  std::uint64_t min = 0;
  std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  bool power_of_two = false;
  [[nodiscard]] bool is_unbounded() const noexcept {
    return min == 0 && max == std::numeric_limits<std::uint64_t>::max() && !power_of_two;
  }
};

inline constexpr bool required = true;
inline constexpr bool optional_param = false;

/// One parameter a resource takes.
struct spec_parameter {
  std::string name;
  param_type type = param_type::text;
  bool is_required = false;
  std::string default_text;  ///< what the resource uses when it is not given (for docs and --list)
  std::string doc;           ///< one line
  /// When true, `default_text` is a value in spec syntax that the builder uses when the
  /// parameter is not given, exactly as if written (so a default of `50%` resolves like a
  /// written percentage, and `make` always sees the parameter).
  bool default_is_value = false;
  /// The accepted values (size and count parameters; other types ignore it).
  param_range range{};

  /// This parameter, accepting only values in [min, max].
  spec_parameter within(std::uint64_t min, std::uint64_t max) && {
    range.min = min;
    range.max = max;
    return std::move(*this);
  }
  /// This parameter, accepting only powers of two.
  spec_parameter power_of_two() && {
    range.power_of_two = true;
    return std::move(*this);
  }
};

/// The range of `p` in words for documentation and --list-resources ("256B to 1GiB, a
/// power of two"); empty when any value of its type is accepted.
std::string describe_range(spec_parameter const& p);
/// A size as a spec would write it, in the largest binary unit that divides it (1GiB, 1536B).
std::string size_in_spec_units(std::uint64_t bytes);

spec_parameter size_param(std::string name, bool is_required, std::string doc, std::string default_text = {});
spec_parameter count_param(std::string name, bool is_required, std::string doc, std::string default_text = {});
spec_parameter number_param(std::string name, bool is_required, std::string doc, std::string default_text = {});
spec_parameter flag_param(std::string name, bool is_required, std::string doc, std::string default_text = {});
spec_parameter text_param(std::string name, bool is_required, std::string doc, std::string default_text = {});
/// An optional size parameter whose default is a spec value (`"50%"`, `"64KiB"`) that the
/// builder applies when the parameter is not given.
spec_parameter size_param_defaulting_to(std::string name, std::string default_value, std::string doc);

/// The typed arguments of one layer, as the builder checked them.
class spec_arguments {
 public:
  struct size_value { std::size_t bytes; };
  struct count_value { std::uint64_t n; };
  using value = std::variant<size_value, count_value, double, bool, std::string>;

  void set(std::string name, value v) { values_.emplace_back(std::move(name), std::move(v)); }
  [[nodiscard]] bool has(std::string_view name) const noexcept { return find(name) != nullptr; }
  /// Only checking: `name` was written as a percentage, so it is absent rather than at its
  /// default (a `validate` that reads the default in its place would judge a value the
  /// spec does not give).
  void set_unresolved(std::string name) { unresolved_.push_back(std::move(name)); }
  [[nodiscard]] bool is_unresolved(std::string_view name) const noexcept {
    for (auto const& n : unresolved_) {
      if (n == name) { return true; }
    }
    return false;
  }
  /// The value of a size/count/number/flag/text parameter, or nullopt when not given.
  [[nodiscard]] std::optional<std::size_t> size(std::string_view name) const {
    auto const v = get<size_value>(name);
    return v ? std::optional<std::size_t>{v->bytes} : std::nullopt;
  }
  [[nodiscard]] std::optional<std::uint64_t> count(std::string_view name) const {
    auto const v = get<count_value>(name);
    return v ? std::optional<std::uint64_t>{v->n} : std::nullopt;
  }
  [[nodiscard]] std::optional<double> number(std::string_view name) const { return get<double>(name); }
  [[nodiscard]] std::optional<bool> flag(std::string_view name) const { return get<bool>(name); }
  [[nodiscard]] std::optional<std::string> text(std::string_view name) const { return get<std::string>(name); }

 private:
  [[nodiscard]] value const* find(std::string_view name) const noexcept {
    for (auto const& [n, v] : values_) {
      if (n == name) { return &v; }
    }
    return nullptr;
  }
  template <typename T>
  [[nodiscard]] std::optional<T> get(std::string_view name) const {
    auto const* v = find(name);
    if (v == nullptr) { return std::nullopt; }
    if (auto const* typed = std::get_if<T>(v)) { return *typed; }
    throw logic_error("spec registry: parameter '" + std::string{name} + "' was read with the wrong type");
  }
  std::vector<std::pair<std::string, value>> values_;
  std::vector<std::string> unresolved_;
};

/// Thrown by a resource's `validate` to refuse a combination of values; the builder turns
/// it into a `spec_error` pointing at `parameter`'s value (or at the layer when that
/// parameter was not written).
class spec_parameter_error : public logic_error {
 public:
  spec_parameter_error(std::string parameter, std::string const& message)
      : logic_error{message}, parameters_{std::move(parameter)} {}
  /// A combination: the error points at the first of `parameters` the spec writes (one
  /// left at its default cannot be pointed at).
  spec_parameter_error(std::vector<std::string> parameters, std::string const& message)
      : logic_error{message}, parameters_{std::move(parameters)} {}
  [[nodiscard]] std::string const& parameter() const noexcept { return parameters_.front(); }
  [[nodiscard]] std::vector<std::string> const& parameters() const noexcept { return parameters_; }

 private:
  std::vector<std::string> parameters_;
};

/// Whether a resource sits above another (adaptors, suballocators) or at the bottom.
enum class upstream_rule { none, required };
inline constexpr upstream_rule bottom_resource = upstream_rule::none;
inline constexpr upstream_rule needs_upstream = upstream_rule::required;

/// One resource a spec can name.
struct spec_resource {
  using make_fn = resource_ptr (*)(spec_arguments const& args, resource_ptr upstream);
  /// Checks a combination of values before anything is built; throws spec_parameter_error.
  using validate_fn = void (*)(spec_arguments const& args);

  std::string name;
  std::string summary;  ///< one line: what it is
  upstream_rule upstream = upstream_rule::required;
  std::vector<spec_parameter> parameters;
  make_fn make = nullptr;
  /// For a bottom resource: the parameter whose absolute size is what percentages in this
  /// stack are shares of (`simulated`'s capacity). Empty: device memory.
  std::string capacity_parameter{};
  /// For a bottom resource: what a simulation (mrstack-replay --simulate) builds in its
  /// place, given `capacity=`. Empty: `simulated`. The vmm upstream names `simulated_vmm`,
  /// so a simulated replay keeps its granule rounding.
  std::string simulation_twin{};
  /// For a bottom resource that touches no memory itself (`simulated`, `simulated_vmm`):
  /// a simulation keeps it as the spec gives it.
  bool is_simulation = false;
  /// For a bottom resource that knows its own footprint better than a layer above it can
  /// (cuda_async: the driver pool's reserved memory; vmm: the physical memory mapped, and
  /// a pool must sit directly on it to grow in place): mrstack-replay puts no
  /// footprint_meter above it and asks it instead.
  bool reports_own_footprint = false;
  /// Combinations of values the ranges alone cannot check (null: none). Runs when the stack
  /// is built, and in `check_stack_spec`, where a size given as a percentage (a share of
  /// memory not known yet) is absent from `args` (`is_unresolved` says so): check only
  /// what is there.
  validate_fn validate = nullptr;
  /// A text parameter naming a file the resource creates or truncates when built
  /// (logging's `file`; empty: none). Two layers of one stack naming one file are refused:
  /// each truncated and wrote the file the other was writing, leaving neither's log. Two
  /// layers that leave it out both write the resource's default file, and are refused too.
  std::string output_file_parameter{};
};

/// Adds a resource; a name already registered is a `logic_error`. Thread-safe.
void register_resource(spec_resource resource);
/// The resource called `name`, or nullptr. The pointer stays valid for the process.
spec_resource const* find_resource(std::string_view name);
/// Every registered resource, sorted by name.
std::vector<spec_resource const*> registered_resources();

}  // namespace mrstack
