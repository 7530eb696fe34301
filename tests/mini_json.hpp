#pragma once
// A small JSON reader for tests that check files mrstack writes: numbers as double,
// strings with the escapes the writers use, objects keep their keys. Throws on bad input.
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace test {

struct json_value {
  enum class kind { null, boolean, number, string, array, object } type = kind::null;
  bool boolean = false;
  double number = 0;
  std::string text;
  std::vector<json_value> items;
  std::map<std::string, json_value> fields;

  json_value const& at(std::string const& key) const {
    auto const it = fields.find(key);
    if (type != kind::object || it == fields.end()) { throw std::runtime_error("no key '" + key + "'"); }
    return it->second;
  }
  json_value const& at(std::size_t i) const {
    if (type != kind::array || i >= items.size()) { throw std::runtime_error("no item " + std::to_string(i)); }
    return items[i];
  }
  [[nodiscard]] bool is_null() const { return type == kind::null; }
  /// An array of numbers (null entries become -1).
  [[nodiscard]] std::vector<double> numbers() const {
    std::vector<double> out;
    for (auto const& v : items) { out.push_back(v.type == kind::number ? v.number : -1); }
    return out;
  }
};

class json_reader {
 public:
  explicit json_reader(std::string const& text) : s_{text} {}
  json_value document() {
    json_value v = value();
    space();
    if (i_ != s_.size()) { fail("text after the value"); }
    return v;
  }

 private:
  [[noreturn]] void fail(std::string const& what) const {
    throw std::runtime_error("json at " + std::to_string(i_) + ": " + what);
  }
  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) { ++i_; }
  }
  bool take(char const* word) {
    std::string const w{word};
    if (s_.compare(i_, w.size(), w) != 0) { return false; }
    i_ += w.size();
    return true;
  }
  std::string string() {
    if (s_[i_] != '"') { fail("expected a string"); }
    ++i_;
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c == '\\') {
        char const e = s_.at(i_++);
        if (e == 'n') { c = '\n'; } else if (e == 't') { c = '\t'; } else if (e == 'r') { c = '\r'; }
        else if (e == 'u') { c = static_cast<char>(std::strtol(s_.substr(i_, 4).c_str(), nullptr, 16)); i_ += 4; }
        else { c = e; }
      }
      out += c;
    }
    if (i_ >= s_.size()) { fail("unterminated string"); }
    ++i_;
    return out;
  }
  json_value value() {
    space();
    if (i_ >= s_.size()) { fail("expected a value"); }
    json_value v;
    char const c = s_[i_];
    if (c == '{') {
      v.type = json_value::kind::object;
      ++i_;
      space();
      if (s_[i_] == '}') { ++i_; return v; }
      while (true) {
        space();
        std::string const key = string();
        space();
        if (s_[i_++] != ':') { fail("expected ':'"); }
        v.fields[key] = value();
        space();
        if (s_[i_] == ',') { ++i_; continue; }
        if (s_[i_++] != '}') { fail("expected '}'"); }
        return v;
      }
    }
    if (c == '[') {
      v.type = json_value::kind::array;
      ++i_;
      space();
      if (s_[i_] == ']') { ++i_; return v; }
      while (true) {
        v.items.push_back(value());
        space();
        if (s_[i_] == ',') { ++i_; continue; }
        if (s_[i_++] != ']') { fail("expected ']'"); }
        return v;
      }
    }
    if (c == '"') {
      v.type = json_value::kind::string;
      v.text = string();
      return v;
    }
    if (take("null")) { return v; }
    if (take("true")) { v.type = json_value::kind::boolean; v.boolean = true; return v; }
    if (take("false")) { v.type = json_value::kind::boolean; return v; }
    char* end = nullptr;
    v.number = std::strtod(s_.c_str() + i_, &end);
    if (end == s_.c_str() + i_) { fail("expected a value"); }
    v.type = json_value::kind::number;
    i_ = static_cast<std::size_t>(end - s_.c_str());
    return v;
  }

  std::string const& s_;
  std::size_t i_ = 0;
};

inline json_value parse_json(std::string const& text) { return json_reader{text}.document(); }

}  // namespace test
