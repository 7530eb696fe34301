// One layer's arguments: matched to the registry entry's parameters (by name, by position,
// or a flag's bare name), converted to their types, checked against their ranges. The
// builder (src/spec/builder.cpp) runs this for every layer before building anything.
#include <mrstack/spec.hpp>
#include <mrstack/spec_registry.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

#include "spec/spec_detail.hpp"

namespace mrstack::detail {

std::string spec_text_for_errors(stack_spec const& spec) { return spec.text.empty() ? to_string(spec) : spec.text; }

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

std::vector<std::string> parameter_names(spec_resource const& r) {
  std::vector<std::string> names;
  for (auto const& p : r.parameters) { names.push_back(p.name); }
  return names;
}

std::string example_of(param_type type) {
  switch (type) {
    case param_type::size: return "1GiB";
    case param_type::count: return "4";
    case param_type::number: return "0.5";
    case param_type::flag: return "true";
    case param_type::text: return "...";
  }
  return "...";
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

/// The decimal unit a size is written in ("GB"), or empty for a binary unit or bytes.
std::string decimal_unit(std::string const& text) {
  std::string const t = trim(text);
  std::string const l = lower(t);
  for (char const* unit : {"kb", "mb", "gb", "tb"}) {
    if (l.size() > 2 && l.ends_with(unit)) { return t.substr(t.size() - 2); }
  }
  return {};
}

/// The note for `1GB`: what it means, what the binary unit would mean, how to say either.
std::string decimal_unit_note(std::string const& spec_text, std::string const& what, std::string const& text,
                              std::size_t bytes) {
  std::string const unit = decimal_unit(text);
  char const prefix = static_cast<char>(std::toupper(static_cast<unsigned char>(unit[0])));
  static constexpr char const* powers[] = {"10^3", "10^6", "10^9", "10^12"};
  static constexpr char const* binary[] = {"2^10", "2^20", "2^30", "2^40"};
  std::size_t const k = prefix == 'K' ? 0 : prefix == 'M' ? 1 : prefix == 'G' ? 2 : 3;
  return "mrstack: note: in the stack spec \"" + spec_text + "\", " + what + "=" + trim(text) + " is " +
         std::to_string(bytes) + " bytes: " + prefix + "B is " + powers[k] + " bytes, " + prefix + "iB is " +
         binary[k] + "; write " + prefix + "iB if that is what you meant (this note is shown once)";
}

class layer_checker {
 public:
  layer_checker(argument_checker& context, spec_layer const& layer, spec_resource const& entry)
      : context_{context}, layer_{layer}, entry_{entry}, given_at_(entry.parameters.size(), 0),
        given_(entry.parameters.size(), false) {}

  spec_arguments run() {
    std::size_t positional = 0;
    bool seen_named = false;
    for (auto const& arg : layer_.arguments) {
      if (auto const flag = bare_flag(arg)) {
        mark_given(*flag, arg.value_column);
        args_.set(entry_.parameters[*flag].name, true);
        continue;
      }
      if (arg.name.empty() && seen_named) {
        fail(arg.value_column, "a positional argument cannot follow a named one in " + layer_.name +
                                   "(...): write it as name=value");
      }
      seen_named = seen_named || !arg.name.empty();
      std::size_t const index = arg.name.empty() ? next_positional(arg, positional) : named(arg);
      mark_given(index, arg.name.empty() ? arg.value_column : arg.name_column);
      set_value(arg, entry_.parameters[index]);
    }
    apply_defaults();
    return std::move(args_);
  }

 private:
  /// A positional argument that is exactly the name of one of the entry's flags: that flag
  /// set to true (`logging(file=x, async)`), wherever it stands.
  std::optional<std::size_t> bare_flag(spec_argument const& arg) const {
    if (!arg.name.empty()) { return std::nullopt; }
    std::string const text = trim(arg.value);
    for (std::size_t i = 0; i < entry_.parameters.size(); ++i) {
      if (entry_.parameters[i].type == param_type::flag && entry_.parameters[i].name == text) { return i; }
    }
    return std::nullopt;
  }

  std::size_t next_positional(spec_argument const& arg, std::size_t& positional) const {
    if (positional >= entry_.parameters.size()) {
      fail(arg.value_column, entry_.parameters.empty()
                                 ? entry_.name + " takes no arguments"
                                 : "too many positional arguments for " + entry_.name + ": it takes " +
                                       join_alternatives(parameter_names(entry_)) + ", in that order");
    }
    return positional++;
  }

  std::size_t named(spec_argument const& arg) const {
    auto const it = std::find_if(entry_.parameters.begin(), entry_.parameters.end(),
                                 [&](spec_parameter const& p) { return p.name == arg.name; });
    if (it != entry_.parameters.end()) { return static_cast<std::size_t>(it - entry_.parameters.begin()); }
    std::string what = "unknown parameter '" + arg.name + "' for " + entry_.name;
    if (entry_.parameters.empty()) { fail(arg.name_column, what + ": " + entry_.name + " takes no parameters"); }
    if (auto const near = closest_name(arg.name, parameter_names(entry_)); !near.empty()) {
      what += " (did you mean '" + near + "'?)";
    }
    fail(arg.name_column, what + "; expected " + join_alternatives(parameter_names(entry_)));
  }

  void mark_given(std::size_t index, std::size_t column) {
    if (given_[index]) {
      std::string const first = given_at_[index] > 0 ? " (first at column " + std::to_string(given_at_[index]) + ")" : "";
      fail(column, "parameter '" + entry_.parameters[index].name + "' of " + entry_.name + " is given twice" + first);
    }
    given_[index] = true;
    given_at_[index] = column;
  }

  void apply_defaults() {
    for (std::size_t i = 0; i < entry_.parameters.size(); ++i) {
      auto const& param = entry_.parameters[i];
      if (!given_[i] && param.default_is_value) {
        // A default in spec syntax counts as written, at the layer's column.
        spec_argument const implied{param.name, param.default_text, layer_.column, layer_.column};
        set_value(implied, param);
        continue;
      }
      if (param.is_required && !given_[i]) {
        fail(layer_.column, entry_.name + " needs its parameter '" + param.name + "' (" + param.doc +
                                "), for example " + entry_.name + "(" + param.name + "=" + example_of(param.type) + ")");
      }
    }
  }

  /// Converts and records a value. Only checking, a percentage has nothing to be a share
  /// of yet: it is checked for syntax and left out, so a combination check (`validate`)
  /// still runs on every value that is known (arena's size, 50% by default, had kept its
  /// other parameters unchecked until the stack was built).
  void set_value(spec_argument const& arg, spec_parameter const& param) {
    auto value = convert(arg, param);
    std::string const text = trim(arg.value);
    bool const unresolved = param.type == param_type::size && !context_.percent_base && !text.empty() && text.back() == '%';
    if (unresolved) {
      args_.set_unresolved(param.name);
    } else {
      args_.set(param.name, std::move(value));
    }
  }

  spec_arguments::value convert(spec_argument const& arg, spec_parameter const& param) {
    std::string const text = trim(arg.value);
    switch (param.type) {
      case param_type::size: return spec_arguments::size_value{convert_size(arg, param, text)};
      case param_type::count: {
        std::uint64_t n = 0;
        auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
        if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) {
          bad_value(arg, param, ec == std::errc::result_out_of_range ? "the number is too large"
                                                                      : "expected a whole number such as 4");
        }
        check_range(arg, param, n);
        return spec_arguments::count_value{n};
      }
      case param_type::number: {
        double x = 0;
        auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
        if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) {
          bad_value(arg, param, "expected a number such as 0.5");
        }
        // from_chars also reads nan and inf, which no parameter can mean ("a real number").
        if (!std::isfinite(x)) { bad_value(arg, param, "expected a finite number such as 0.5"); }
        return x;
      }
      case param_type::flag: {
        std::string const v = lower(text);
        if (v == "true" || v == "yes" || v == "on" || v == "1") { return true; }
        if (v == "false" || v == "no" || v == "off" || v == "0") { return false; }
        bad_value(arg, param, "expected true or false (also yes/no, on/off, 1/0; or the bare name for true)");
      }
      case param_type::text: return arg.value;
    }
    bad_value(arg, param, "unsupported parameter type");
  }

  std::size_t convert_size(spec_argument const& arg, spec_parameter const& param, std::string const& text) {
    if (!text.empty() && text.back() == '%') {
      std::string why;
      auto const share = parse_percentage(text, why);
      if (!share) { bad_value(arg, param, why); }
      context_.saw_percentage = true;
      if (!context_.percent_base) { return 0; }
      auto const base = static_cast<long double>(context_.percent_base(arg));
      auto const bytes = static_cast<std::size_t>(base * *share / 100.0L);
      check_range(arg, param, bytes, " (" + text + " of " + std::to_string(static_cast<std::size_t>(base)) + " B)");
      return bytes;
    }
    std::string why;
    auto const bytes = parse_size(text, &why);
    if (!bytes) { bad_value(arg, param, why + ", or a percentage such as 50%"); }
    check_range(arg, param, *bytes);
    if (context_.note && !decimal_unit(text).empty() && arg.value_column != 0) {
      context_.note(decimal_unit_note(spec_text_for_errors(context_.spec), entry_.name + "(" + param.name, text, *bytes));
    }
    return *bytes;
  }

  void check_range(spec_argument const& arg, spec_parameter const& param, std::uint64_t v,
                   std::string const& resolved = {}) const {
    auto const& r = param.range;
    bool const pow2_ok = !r.power_of_two || (v != 0 && (v & (v - 1)) == 0);
    if (v >= r.min && v <= r.max && pow2_ok) { return; }
    std::string const shown = param.type == param_type::size ? size_in_spec_units(v) : std::to_string(v);
    bad_value(arg, param, shown + resolved + " is out of range: expected " + describe_range(param));
  }

  [[noreturn]] void bad_value(spec_argument const& arg, spec_parameter const& param, std::string const& why) const {
    fail(arg.value_column, "bad value '" + arg.value + "' for " + entry_.name + "'s " + param.name + " (a " +
                               to_string(param.type) + "): " + why);
  }

  [[noreturn]] void fail(std::size_t column, std::string const& what) const {
    throw_spec_error(spec_text_for_errors(context_.spec), column, what);
  }

  argument_checker& context_;
  spec_layer const& layer_;
  spec_resource const& entry_;
  std::vector<std::size_t> given_at_;  // column of each parameter given
  std::vector<bool> given_;
  spec_arguments args_;
};

}  // namespace

spec_arguments argument_checker::check(spec_layer const& layer, spec_resource const& entry) {
  return layer_checker{*this, layer, entry}.run();
}

}  // namespace mrstack::detail
