// The stack-spec builder: checks a parsed spec against the registry (names, parameters,
// values, the shape of the stack), then builds it bottom-up. `check_stack_spec` runs the
// same checks and builds nothing.
#include <mrstack/spec.hpp>
#include <mrstack/spec_registry.hpp>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <cuda_runtime_api.h>

#include "device_scope.hpp"
#include "spec/spec_detail.hpp"

namespace mrstack {

namespace {

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

/// The default note handler: the first note of the process goes to stderr.
void note_once_to_stderr(std::string const& note) {
  static std::atomic<bool> shown{false};
  if (!shown.exchange(true)) { std::fprintf(stderr, "%s\n", note.c_str()); }
}

/// Checks (and, when building, builds) one spec. The same code runs both ways so that
/// `check_stack_spec` finds exactly the errors `build_stack` would.
class spec_builder {
 public:
  spec_builder(stack_spec const& spec, build_options const& options, bool build)
      : spec_{spec}, options_{options}, build_{build} {}

  resource_ptr run() {
    if (spec_.layers.empty()) { fail(0, "the spec has no layers: expected a resource name such as cuda"); }
    check_depth();
    std::vector<spec_resource const*> entries;
    for (auto const& layer : spec_.layers) { entries.push_back(lookup(layer)); }
    check_shape(entries);
    bottom_entry_ = entries.back();
    // Arguments are checked top to bottom (errors come in reading order), built bottom-up.
    std::vector<spec_arguments> arguments;
    for (std::size_t i = 0; i < spec_.layers.size(); ++i) {
      arguments.push_back(check_layer(spec_.layers[i], *entries[i]));
    }
    check_output_files(entries, arguments);
    return build_ ? build(entries, arguments) : nullptr;
  }

 private:
  void check_depth() const {
    if (spec_.layers.size() <= max_stack_layers) { return; }
    fail(spec_.layers[max_stack_layers].column,
         "the stack has " + std::to_string(spec_.layers.size()) + " layers; at most " +
             std::to_string(max_stack_layers) + " are allowed (each call walks every layer on the thread's stack)");
  }

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

  /// One layer's arguments, typed and in range, then the entry's own check of combinations.
  spec_arguments check_layer(spec_layer const& layer, spec_resource const& entry) {
    detail::argument_checker checker{spec_, nullptr, nullptr};
    if (build_ || options_.percent_base) {  // a check resolves them only against a given base
      checker.percent_base = [this](spec_argument const& arg) { return percent_base(arg); };
    }
    if (build_) { checker.note = options_.on_note ? options_.on_note : note_once_to_stderr; }
    auto args = checker.check(layer, entry);
    if (entry.validate != nullptr) {
      try {
        entry.validate(args);
      } catch (spec_parameter_error const& e) {
        std::size_t column = layer.column;
        for (auto const& name : e.parameters()) {
          if (column == layer.column) { column = column_of(layer, entry, name); }
        }
        fail(column, "bad arguments for " + entry.name + ": " + e.what());
      }
    }
    return args;
  }

  /// Refuses two layers that write one file (spec_resource::output_file_parameter): the
  /// second layer built truncated the file the first was writing, and both wrote into it.
  /// Paths are compared as they lead, '.' and '..' and links resolved where they exist.
  void check_output_files(std::vector<spec_resource const*> const& entries,
                          std::vector<spec_arguments> const& arguments) const {
    struct output {
      std::size_t layer;
      std::filesystem::path where;  // empty: the resource's default file
    };
    std::vector<output> outputs;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      std::string const& parameter = entries[i]->output_file_parameter;
      if (parameter.empty()) { continue; }
      std::filesystem::path where;
      if (auto const file = arguments[i].text(parameter); file && !file->empty()) {
        std::error_code ec;
        where = std::filesystem::weakly_canonical(*file, ec);
        if (ec) { where = std::filesystem::path{*file}.lexically_normal(); }
      }
      for (output const& earlier : outputs) {
        // No file given: the resource's own default, the same file only for the same resource.
        if (earlier.where != where || (where.empty() && entries[earlier.layer] != entries[i])) { continue; }
        auto const& layer = spec_.layers[i];
        std::size_t const column = where.empty() ? layer.column : column_of(layer, *entries[i], parameter);
        std::string const file =
            where.empty() ? "its default " + parameter : parameter + " '" + *arguments[i].text(parameter) + "'";
        auto const& first = spec_.layers[earlier.layer];
        fail(column, layer.name + " writes " + file + ", as the " + first.name + " layer at column " +
                         std::to_string(first.column) + " does: each would truncate and write into the other's " +
                         parameter + "; give each its own");
      }
      outputs.push_back({i, where});
    }
  }

  /// Where parameter `name` is written in `layer` (its value), else the layer's name.
  static std::size_t column_of(spec_layer const& layer, spec_resource const& entry, std::string const& name) {
    std::size_t positional = 0;
    for (auto const& arg : layer.arguments) {
      std::string const* arg_name = &arg.name;
      if (arg.name.empty()) {
        // A flag's bare name is that flag and takes no position (as the argument checker reads it).
        if (auto const* flag = bare_flag(entry, arg)) {
          arg_name = &flag->name;
        } else if (positional < entry.parameters.size()) {
          arg_name = &entry.parameters[positional++].name;
        }
      }
      if (*arg_name == name) { return arg.value_column; }
    }
    return layer.column;
  }

  /// The flag a positional argument names by its bare name, or null.
  static spec_parameter const* bare_flag(spec_resource const& entry, spec_argument const& arg) {
    std::string_view text = arg.value;
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())) != 0) { text.remove_prefix(1); }
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())) != 0) { text.remove_suffix(1); }
    for (auto const& p : entry.parameters) {
      if (p.type == param_type::flag && p.name == text) { return &p; }
    }
    return nullptr;
  }

  resource_ptr build(std::vector<spec_resource const*> const& entries, std::vector<spec_arguments> const& arguments) {
    resource_ptr upstream;
    int layer_device = -1;  // the last `device=` below: the device of the memory the layers above serve
    for (std::size_t i = spec_.layers.size(); i-- > 0;) {
      auto const& layer = spec_.layers[i];
      resource_ptr const below = upstream;  // kept to name it if it refuses this layer
      {
        // A layer over `cuda(device=1)` is built on device 1, as if the whole stack were
        // built for it: its events and streams belong there. Built on the current device
        // instead, a pool's event calls failed on device 1's streams and it fell back to
        // synchronizing the other device.
        detail::device_scope on_device{layer_device};
        detail::building_for marked{layer_device};
        try {
          upstream = entries[i]->make(arguments[i], std::move(upstream));
        } catch (spec_error const&) {
          throw;
        } catch (logic_error const& e) {
          refused(i, below.get(), e.what());
        }
      }
      if (!upstream) { fail(layer.column, "the registry entry for " + layer.name + " built nothing (a bug in its entry)"); }
      if (auto const device = explicit_device(*entries[i], arguments[i])) { layer_device = *device; }
    }
    return upstream;
  }

  /// The device a layer's own `device=` names, if it has that parameter and the spec gives it.
  static std::optional<int> explicit_device(spec_resource const& entry, spec_arguments const& args) {
    for (auto const& p : entry.parameters) {
      if (p.name != "device" || p.type != param_type::count) { continue; }
      if (auto const n = args.count("device")) { return static_cast<int>(*n); }
    }
    return std::nullopt;
  }

  /// Reports layer `i`'s constructor failing with a logic_error. Every message starts with
  /// the name of the resource that threw it: when that is the layer below, it refused a
  /// request the layer made while being built (fixed_size's first chunk, larger than the
  /// fixed_size below serves), which is no fault of the layer's arguments.
  [[noreturn]] void refused(std::size_t i, memory_resource const* below, std::string const& what) const {
    auto const& layer = spec_.layers[i];
    std::string const below_name = below != nullptr ? below->name() : std::string{};
    bool const from_below = !below_name.empty() && what.rfind(below_name + ": ", 0) == 0;
    if (!from_below) { fail(layer.column, layer.name + " refused its arguments: " + what); }
    std::string const request = "a request " + layer.name + " made while being built";
    if (below_name == layer.name) {  // either of the two may have said it
      fail(layer.column, layer.name + " could not be built over " + below_name + ": it refused its arguments, or " +
                             below_name + " below it refused " + request + ": " + what);
    }
    auto const& below_layer = spec_.layers[i + 1];
    std::size_t const column = below_layer.name == below_name ? below_layer.column : layer.column;
    fail(column, below_name + " refused " + request + " over it: " + what);
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
      what += arg.value;
      fail(arg.value_column, what + "' is a share of the device's free memory, but there is no usable CUDA device (" +
                                 cudaGetErrorName(status) + "): " + hint);
    }
    base_ = free_bytes;
    return *base_;
  }

  /// The bottom's absolute capacity argument, when it has one (`simulated(capacity=80GiB)`).
  /// The bottom's arguments are checked here, ahead of their turn, so a bad capacity
  /// reports its own error ('8G' is ambiguous) instead of the percentage falling back to
  /// the device. Checked without a percent base: a capacity that is itself a percentage
  /// is left out, and the device is the base.
  std::optional<std::size_t> bottom_capacity() const {
    auto const& entry = *bottom_entry_;
    if (entry.capacity_parameter.empty()) { return std::nullopt; }
    detail::argument_checker checker{spec_, nullptr, nullptr};
    return checker.check(spec_.layers.back(), entry).size(entry.capacity_parameter);
  }

  [[noreturn]] void fail(std::size_t column, std::string const& what) const {
    detail::throw_spec_error(detail::spec_text_for_errors(spec_), column, what);
  }

  stack_spec const& spec_;
  build_options const& options_;
  bool build_;
  spec_resource const* bottom_entry_ = nullptr;
  std::optional<std::size_t> base_;
};

}  // namespace

void check_stack_spec(stack_spec const& spec) { check_stack_spec(spec, build_options{}); }

void check_stack_spec(stack_spec const& spec, build_options const& options) {
  build_options checked;
  checked.percent_base = options.percent_base;
  (void)spec_builder{spec, checked, false}.run();
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
