// The stack-spec builder: checks a parsed spec against the registry (names, parameters,
// values, the shape of the stack), then builds it bottom-up. `check_stack_spec` runs the
// same checks and builds nothing.
#include <mrstack/spec.hpp>
#include <mrstack/spec_registry.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <functional>

#include <cuda_runtime_api.h>

#include "device_scope.hpp"
#include "spec/spec_detail.hpp"

namespace mrstack {

namespace {

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())) != 0) { s.remove_prefix(1); }
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) { s.remove_suffix(1); }
  return std::string{s};
}

std::string lower(std::string_view s) {
  std::string out;
  for (char c : s) { out += static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }
  return out;
}

std::vector<std::string> resource_names() {
  std::vector<std::string> names;
  for (auto const* r : registered_resources()) { names.push_back(r->name); }
  return names;
}

std::vector<std::string> bottom_names() {
  std::vector<std::string> names;
  for (auto const* r : registered_resources()) {
    if (r->upstream == upstream_rule::none) { names.push_back(r->name); }
  }
  return names;
}

std::vector<std::string> parameter_names(spec_resource const& r) {
  std::vector<std::string> names;
  for (auto const& p : r.parameters) { names.push_back(p.name); }
  return names;
}

/// A percentage such as "50%" or "12.5 %": the share in (0, 100], or an error reason.
std::optional<double> parse_percentage(std::string const& text, std::string& why) {
  std::string number = trim(std::string_view{text}.substr(0, text.size() - 1));
  double share = 0;
  auto const [end, ec] = std::from_chars(number.data(), number.data() + number.size(), share);
  if (number.empty() || ec != std::errc{} || end != number.data() + number.size()) {
    why = "expected a percentage such as 50%";
    return std::nullopt;
  }
  if (!(share > 0.0 && share <= 100.0)) {
    why = "a percentage must be more than 0% and at most 100%";
    return std::nullopt;
  }
  return share;
}

/// Checks (and, when building, builds) one spec. The same code runs both ways so that
/// `check_stack_spec` finds exactly the errors `build_stack` would.
class spec_builder {
 public:
  spec_builder(stack_spec const& spec, build_options const& options, bool build)
      : spec_{spec}, options_{options}, build_{build} {}

  resource_ptr run() {
    if (spec_.layers.empty()) { fail(0, "the spec has no layers: expected a resource name such as cuda"); }
    std::vector<spec_resource const*> entries;
    for (auto const& layer : spec_.layers) { entries.push_back(lookup(layer)); }
    check_shape(entries);
    bottom_entry_ = entries.back();
    // Arguments are checked top to bottom (errors come in reading order), built bottom-up.
    std::vector<spec_arguments> arguments;
    for (std::size_t i = 0; i < spec_.layers.size(); ++i) { arguments.push_back(check_arguments(spec_.layers[i], *entries[i])); }
    if (!build_) { return nullptr; }
    resource_ptr upstream;
    for (std::size_t i = spec_.layers.size(); i-- > 0;) {
      auto const& layer = spec_.layers[i];
      try {
        upstream = entries[i]->make(arguments[i], std::move(upstream));
      } catch (spec_error const&) {
        throw;
      } catch (logic_error const& e) {
        fail(layer.column, layer.name + " refused its arguments: " + e.what());
      }
      if (!upstream) { fail(layer.column, "the registry entry for " + layer.name + " built nothing (a bug in its entry)"); }
    }
    return upstream;
  }

 private:
  spec_resource const* lookup(spec_layer const& layer) const {
    if (auto const* entry = find_resource(layer.name)) { return entry; }
    auto const names = resource_names();
    std::string what = "unknown resource '" + layer.name + "'";
    if (auto const near = detail::closest_name(layer.name, names); !near.empty()) {
      what += " (did you mean '" + near + "'?)";
    }
    fail(layer.column, what + "; expected one of: " + detail::join_alternatives(names));
  }

  void check_shape(std::vector<spec_resource const*> const& entries) const {
    for (std::size_t i = 0; i + 1 < entries.size(); ++i) {
      if (entries[i]->upstream == upstream_rule::none) {
        auto const& below = spec_.layers[i + 1];
        fail(below.column, "'" + below.name + "' is given as the upstream of " + entries[i]->name + ", but " +
                               entries[i]->name +
                               " is a bottom resource (it takes its memory from the system): end the stack at " +
                               entries[i]->name + ", or move it last");
      }
    }
    if (entries.back()->upstream == upstream_rule::required) {
      auto const& last = spec_.layers.back();
      std::size_t const column = last.column == 0 ? 0 : spec_.text.size() + 1;
      fail(column, last.name + " needs an upstream below it: expected '> ' and a resource, for example '" +
                       last.name + " > cuda' (bottom resources: " + detail::join_alternatives(bottom_names()) + ")");
    }
  }

  spec_arguments check_arguments(spec_layer const& layer, spec_resource const& entry) {
    spec_arguments args;
    std::vector<std::size_t> given_at(entry.parameters.size(), 0);  // column of each parameter given (or SIZE_MAX)
    std::vector<bool> given(entry.parameters.size(), false);
    std::size_t positional = 0;
    for (auto const& arg : layer.arguments) {
      std::size_t index = 0;
      std::size_t const arg_column = arg.name.empty() ? arg.value_column : arg.name_column;
      if (arg.name.empty()) {
        if (positional >= entry.parameters.size()) {
          fail(arg.value_column,
               entry.parameters.empty()
                   ? entry.name + " takes no arguments"
                   : "too many positional arguments for " + entry.name + ": it takes " +
                         detail::join_alternatives(parameter_names(entry)) + ", in that order");
        }
        index = positional++;
      } else {
        auto const it = std::find_if(entry.parameters.begin(), entry.parameters.end(),
                                     [&](spec_parameter const& p) { return p.name == arg.name; });
        if (it == entry.parameters.end()) {
          std::string what = "unknown parameter '" + arg.name + "' for " + entry.name;
          if (entry.parameters.empty()) {
            fail(arg.name_column, what + ": " + entry.name + " takes no parameters");
          }
          if (auto const near = detail::closest_name(arg.name, parameter_names(entry)); !near.empty()) {
            what += " (did you mean '" + near + "'?)";
          }
          fail(arg.name_column, what + "; expected " + detail::join_alternatives(parameter_names(entry)));
        }
        index = static_cast<std::size_t>(it - entry.parameters.begin());
      }
      auto const& param = entry.parameters[index];
      if (given[index]) {
        std::string const first = given_at[index] > 0 ? " (first at column " + std::to_string(given_at[index]) + ")" : "";
        fail(arg_column, "parameter '" + param.name + "' of " + entry.name + " is given twice" + first);
      }
      given[index] = true;
      given_at[index] = arg_column;
      args.set(param.name, convert(arg, param, entry));
    }
    for (std::size_t i = 0; i < entry.parameters.size(); ++i) {
      auto const& param = entry.parameters[i];
      if (!given[i] && param.default_is_value) {
        // A default in spec syntax counts as written, at the layer's column.
        spec_argument const implied{param.name, param.default_text, layer.column, layer.column};
        args.set(param.name, convert(implied, param, entry));
        continue;
      }
      if (param.is_required && !given[i]) {
        fail(layer.column, entry.name + " needs its parameter '" + param.name + "' (" + param.doc + "), for example " +
                               entry.name + "(" + param.name + "=" + example_of(param.type) + ")");
      }
    }
    return args;
  }

  static std::string example_of(param_type type) {
    switch (type) {
      case param_type::size: return "1GiB";
      case param_type::count: return "4";
      case param_type::number: return "0.5";
      case param_type::flag: return "true";
      case param_type::text: return "...";
    }
    return "...";
  }

  spec_arguments::value convert(spec_argument const& arg, spec_parameter const& param, spec_resource const& entry) {
    std::string const text = trim(arg.value);
    using size_value = spec_arguments::size_value;
    switch (param.type) {
      case param_type::size: {
        if (!text.empty() && text.back() == '%') {
          std::string why;
          auto const share = parse_percentage(text, why);
          if (!share) { bad_value(arg, param, entry, why); }
          if (!build_) { return size_value{0}; }
          return size_value{static_cast<std::size_t>(static_cast<long double>(percent_base(arg)) * *share / 100.0L)};
        }
        std::string why;
        auto const bytes = parse_size(text, &why);
        if (!bytes) { bad_value(arg, param, entry, why + ", or a percentage such as 50%"); }
        return size_value{*bytes};
      }
      case param_type::count: {
        std::uint64_t n = 0;
        auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
        if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) {
          bad_value(arg, param, entry, ec == std::errc::result_out_of_range ? "the number is too large" : "expected a whole number such as 4");
        }
        return spec_arguments::count_value{n};
      }
      case param_type::number: {
        double x = 0;
        auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
        if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) {
          bad_value(arg, param, entry, "expected a number such as 0.5");
        }
        return x;
      }
      case param_type::flag: {
        std::string const v = lower(text);
        if (v == "true" || v == "yes" || v == "on" || v == "1") { return true; }
        if (v == "false" || v == "no" || v == "off" || v == "0") { return false; }
        bad_value(arg, param, entry, "expected true or false (also yes/no, on/off, 1/0)");
      }
      case param_type::text: return arg.value;
    }
    bad_value(arg, param, entry, "unsupported parameter type");
  }

  [[noreturn]] void bad_value(spec_argument const& arg, spec_parameter const& param, spec_resource const& entry,
                              std::string const& why) const {
    fail(arg.value_column, "bad value '" + arg.value + "' for " + entry.name + "'s " + param.name + " (a " +
                               to_string(param.type) + "): " + why);
  }

  /// What a percentage is a share of (see build_options::percent_base).
  std::size_t percent_base(spec_argument const& arg) {
    if (options_.percent_base) { return *options_.percent_base; }
    if (base_) { return *base_; }
    if (auto capacity = bottom_capacity()) {
      base_ = capacity;
      return *base_;
    }
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    cudaError_t const status = cudaMemGetInfo(&free_bytes, &total_bytes);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      std::string hint = "give an absolute size such as 8GiB";
      if (!bottom_entry_->capacity_parameter.empty()) {
        hint += ", or give " + bottom_entry_->name + " an absolute " + bottom_entry_->capacity_parameter;
      } else {
        hint += ", or build the stack over simulated(capacity=...)";
      }
      std::string what{"'"};  // (appending, not "..." + temporary: GCC 12 warns falsely on that)
      what += trim(arg.value);
      fail(arg.value_column, what + "' is a share of the device's free memory, but there is no usable CUDA device (" +
                                 cudaGetErrorName(status) + "): " + hint);
    }
    base_ = free_bytes;
    return *base_;
  }

  /// The bottom's absolute capacity argument, when it has one (`simulated(capacity=80GiB)`).
  std::optional<std::size_t> bottom_capacity() const {
    auto const& entry = *bottom_entry_;
    if (entry.capacity_parameter.empty()) { return std::nullopt; }
    auto const& layer = spec_.layers.back();
    std::size_t positional = 0;
    for (auto const& arg : layer.arguments) {
      std::string const& name = arg.name.empty() && positional < entry.parameters.size()
                                    ? entry.parameters[positional++].name
                                    : arg.name;
      if (name == entry.capacity_parameter) {
        std::string const text = trim(arg.value);
        if (!text.empty() && text.back() == '%') { return std::nullopt; }
        return parse_size(text);
      }
    }
    return std::nullopt;
  }

  [[noreturn]] void fail(std::size_t column, std::string const& what) const {
    detail::throw_spec_error(spec_.text.empty() ? to_string(spec_) : spec_.text, column, what);
  }

  stack_spec const& spec_;
  build_options const& options_;
  bool build_;
  spec_resource const* bottom_entry_ = nullptr;
  std::optional<std::size_t> base_;
};

}  // namespace

void check_stack_spec(stack_spec const& spec) {
  build_options const options;
  (void)spec_builder{spec, options, false}.run();
}

resource_ptr build_stack(stack_spec const& spec, build_options const& options) {
  detail::device_scope on_device{options.device.value_or(-1)};
  detail::building_for marked{options.device.value_or(-1)};
  return spec_builder{spec, options, true}.run();
}

resource_ptr make_stack(std::string_view spec) { return build_stack(parse_stack_spec(spec)); }

resource_ptr make_stack_from_environment(std::string_view fallback) {
  char const* const env = std::getenv("MRSTACK_RESOURCE");
  if (env == nullptr || *env == '\0') { return make_stack(fallback); }
  try {
    return make_stack(env);
  } catch (spec_error const& e) {
    throw spec_error(std::string{"MRSTACK_RESOURCE: "} + e.what(), e.column());
  }
}

}  // namespace mrstack
