// The registry: the built-in entries (src/spec/resources.cpp) plus any registered at run
// time. Entries live in a deque so the pointers handed out stay valid as it grows.
#include <mrstack/spec_registry.hpp>

#include <algorithm>
#include <iterator>
#include <limits>
#include <deque>
#include <mutex>

#include "spec/spec_detail.hpp"

namespace mrstack {

char const* to_string(param_type type) noexcept {
  switch (type) {
    case param_type::size: return "size";
    case param_type::count: return "count";
    case param_type::number: return "number";
    case param_type::flag: return "flag";
    case param_type::text: return "text";
  }
  return "value";
}

namespace {

spec_parameter make_param(std::string name, param_type type, bool is_required, std::string doc,
                          std::string default_text) {
  return spec_parameter{std::move(name), type, is_required, std::move(default_text), std::move(doc)};
}

/// Refuses an entry no spec could use as registered: every use would fail, at the
/// user's spec, for the registrant's mistake.
void check_entry(spec_resource const& entry) {
  std::string const who = "register_resource: " + entry.name;
  if (!detail::is_spec_name(entry.name)) {
    throw logic_error(who + ": not a name a spec can write (letters, digits and '_', not first a digit)");
  }
  for (std::size_t i = 0; i < entry.parameters.size(); ++i) {
    spec_parameter const& p = entry.parameters[i];
    std::string const param = who + "'s parameter '" + p.name + "'";
    if (!detail::is_spec_name(p.name)) { throw logic_error(param + " is not a name a spec can write"); }
    for (std::size_t j = 0; j < i; ++j) {
      if (entry.parameters[j].name == p.name) { throw logic_error(param + " is listed twice"); }
    }
    if (p.range.min > p.range.max) {
      throw logic_error(param + "'s range is empty (min " + std::to_string(p.range.min) + " > max " +
                        std::to_string(p.range.max) + ")");
    }
    if (p.default_is_value && p.default_text.empty()) { throw logic_error(param + " defaults to no value"); }
    if (p.default_is_value) {
      // Converted as a written value would be, on a copy with only this parameter.
      spec_resource alone{entry.name, entry.summary, entry.upstream, {p}, entry.make};
      alone.parameters[0].is_required = false;
      stack_spec const probe{entry.name, {spec_layer{entry.name, {}, 1}}};
      try {
        (void)detail::argument_checker{probe, nullptr, nullptr}.check(probe.layers[0], alone);
      } catch (spec_error const& e) {
        throw logic_error(param + " has a default in spec syntax, '" + p.default_text + "', that its type refuses: " +
                          e.what());
      }
    }
  }
}

struct registry {
  std::mutex mutex;
  std::deque<spec_resource> entries;

  registry() {
    for (auto& entry : detail::builtin_resources()) { add(std::move(entry)); }
  }

  void add(spec_resource entry) {
    if (entry.name.empty() || entry.make == nullptr) {
      throw logic_error("register_resource: an entry needs a name and a make function");
    }
    check_entry(entry);
    for (auto const& e : entries) {
      if (e.name == entry.name) { throw logic_error("register_resource: '" + entry.name + "' is already registered"); }
    }
    entries.push_back(std::move(entry));
  }
};

registry& the_registry() {
  static registry r;
  return r;
}

}  // namespace

spec_parameter size_param(std::string name, bool is_required, std::string doc, std::string default_text) {
  return make_param(std::move(name), param_type::size, is_required, std::move(doc), std::move(default_text));
}
spec_parameter count_param(std::string name, bool is_required, std::string doc, std::string default_text) {
  return make_param(std::move(name), param_type::count, is_required, std::move(doc), std::move(default_text));
}
spec_parameter number_param(std::string name, bool is_required, std::string doc, std::string default_text) {
  return make_param(std::move(name), param_type::number, is_required, std::move(doc), std::move(default_text));
}
spec_parameter flag_param(std::string name, bool is_required, std::string doc, std::string default_text) {
  return make_param(std::move(name), param_type::flag, is_required, std::move(doc), std::move(default_text));
}
spec_parameter text_param(std::string name, bool is_required, std::string doc, std::string default_text) {
  return make_param(std::move(name), param_type::text, is_required, std::move(doc), std::move(default_text));
}

std::string size_in_spec_units(std::uint64_t bytes) {
  static constexpr char const* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::size_t unit = 0;
  while (unit + 1 < std::size(units) && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + units[unit];
}

std::string describe_range(spec_parameter const& p) {
  if (p.type != param_type::size && p.type != param_type::count) { return {}; }
  auto const& r = p.range;
  if (r.is_unbounded()) { return {}; }
  auto const value = [&](std::uint64_t v) {
    return p.type == param_type::size ? size_in_spec_units(v) : std::to_string(v);
  };
  std::string out;
  bool const has_max = r.max != std::numeric_limits<std::uint64_t>::max();
  if (r.min > 0 && has_max) {
    out = value(r.min) + " to " + value(r.max);
  } else if (has_max) {
    out = "at most " + value(r.max);
  } else if (r.min > 0) {
    out = "at least " + value(r.min);
  }
  if (r.power_of_two) { out += out.empty() ? "a power of two" : ", a power of two"; }
  return out;
}

spec_parameter size_param_defaulting_to(std::string name, std::string default_value, std::string doc) {
  auto p = make_param(std::move(name), param_type::size, false, std::move(doc), std::move(default_value));
  p.default_is_value = true;
  return p;
}

void register_resource(spec_resource resource) {
  auto& r = the_registry();
  std::lock_guard lock{r.mutex};
  r.add(std::move(resource));
}

spec_resource const* find_resource(std::string_view name) {
  auto& r = the_registry();
  std::lock_guard lock{r.mutex};
  for (auto const& e : r.entries) {
    if (e.name == name) { return &e; }
  }
  return nullptr;
}

std::vector<spec_resource const*> registered_resources() {
  auto& r = the_registry();
  std::lock_guard lock{r.mutex};
  std::vector<spec_resource const*> out;
  for (auto const& e : r.entries) { out.push_back(&e); }
  std::sort(out.begin(), out.end(), [](auto const* a, auto const* b) { return a->name < b->name; });
  return out;
}

}  // namespace mrstack
