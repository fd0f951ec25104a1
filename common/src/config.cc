#include "zps/common/config.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

namespace zps {
namespace {

std::string Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

}  // namespace

Result<int64_t> ParseInt(std::string_view text, int64_t min, int64_t max) {
  std::string s = Trim(text);
  if (s.empty()) return InvalidArgument("expected an integer, got an empty value");
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) {
    return InvalidArgument("expected an integer, got '" + s + "'");
  }
  if (v < min || v > max) {
    return OutOfRange("value " + s + " is outside [" + std::to_string(min) + ", " +
                      std::to_string(max) + "]");
  }
  return static_cast<int64_t>(v);
}

Result<double> ParseDouble(std::string_view text) {
  std::string s = Trim(text);
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v)) {
    return InvalidArgument("expected a finite number, got '" + s + "'");
  }
  return v;
}

Result<bool> ParseBool(std::string_view text) {
  std::string s = Trim(text);
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  return InvalidArgument("expected a boolean (true/false), got '" + s + "'");
}

Result<uint64_t> ParseBytes(std::string_view text) {
  std::string s = Trim(text);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return InvalidArgument("expected a byte size such as 2GiB, got '" + s + "'");
  char* end = nullptr;
  std::string num = s.substr(0, i);
  double v = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size()) {
    return InvalidArgument("expected a byte size such as 2GiB, got '" + s + "'");
  }
  std::string unit = Trim(std::string_view(s).substr(i));
  double mult = 1;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "K" || unit == "KiB")
    mult = 1024.0;
  else if (unit == "M" || unit == "MiB")
    mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TiB")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB")
    mult = 1e3;
  else if (unit == "MB")
    mult = 1e6;
  else if (unit == "GB")
    mult = 1e9;
  else if (unit == "TB")
    mult = 1e12;
  else
    return InvalidArgument("unknown byte unit '" + unit + "' in '" + s + "'");
  double bytes = v * mult;
  if (bytes > static_cast<double>(std::numeric_limits<uint64_t>::max() / 2)) {
    return OutOfRange("byte size '" + s + "' is too large");
  }
  return static_cast<uint64_t>(std::llround(bytes));
}

Result<std::pair<std::string, uint16_t>> SplitHostPort(std::string_view endpoint) {
  size_t colon = endpoint.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return InvalidArgument("endpoint '" + std::string(endpoint) + "' is not host:port");
  }
  auto port = ParseInt(endpoint.substr(colon + 1), 1, 65535);
  if (!port.ok()) {
    return InvalidArgument("endpoint '" + std::string(endpoint) + "': " + port.status().message());
  }
  std::string host(endpoint.substr(0, colon));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, static_cast<uint16_t>(*port));
}

Result<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("token file '" + path + "' cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string t = ss.str();
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  if (t.empty()) return InvalidArgument("token file '" + path + "' is empty");
  return t;
}

std::string EnvName(std::string_view option) {
  std::string env = "ZPS_";
  for (char c : option) {
    env += (c == '-' || c == '.') ? '_'
                                  : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return env;
}

Flags::Flags(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

void Flags::Add(std::string name, std::string help, std::string* field) {
  options_.push_back({std::move(name), std::move(help), *field, false, [field](std::string_view v) {
                        *field = std::string(v);
                        return Status::Ok();
                      }});
}

void Flags::Add(std::string name, std::string help, bool* field) {
  options_.push_back({std::move(name), std::move(help), *field ? "true" : "false", true,
                      [field](std::string_view v) -> Status {
                        ZPS_ASSIGN_OR_RETURN(*field, ParseBool(v));
                        return Status::Ok();
                      }});
}

void Flags::Add(std::string name, std::string help, double* field) {
  std::ostringstream def;
  def << *field;
  options_.push_back(
      {std::move(name), std::move(help), def.str(), false, [field](std::string_view v) -> Status {
         ZPS_ASSIGN_OR_RETURN(*field, ParseDouble(v));
         return Status::Ok();
       }});
}

void Flags::Add(std::string name, std::string help, int64_t* field, int64_t min, int64_t max) {
  options_.push_back({std::move(name), std::move(help), std::to_string(*field), false,
                      [field, min, max](std::string_view v) -> Status {
                        ZPS_ASSIGN_OR_RETURN(*field, ParseInt(v, min, max));
                        return Status::Ok();
                      }});
}

void Flags::Add(std::string name, std::string help, int* field, int min, int max) {
  options_.push_back({std::move(name), std::move(help), std::to_string(*field), false,
                      [field, min, max](std::string_view v) -> Status {
                        ZPS_ASSIGN_OR_RETURN(int64_t x, ParseInt(v, min, max));
                        *field = static_cast<int>(x);
                        return Status::Ok();
                      }});
}

void Flags::AddBytes(std::string name, std::string help, uint64_t* field) {
  options_.push_back({std::move(name), std::move(help), std::to_string(*field), false,
                      [field](std::string_view v) -> Status {
                        ZPS_ASSIGN_OR_RETURN(*field, ParseBytes(v));
                        return Status::Ok();
                      }});
}

void Flags::AddCustom(std::string name, std::string help, std::string default_text,
                      std::function<Status(std::string_view)> set) {
  options_.push_back(
      {std::move(name), std::move(help), std::move(default_text), false, std::move(set)});
}

void Flags::AllowPositional(size_t max_positional, std::string usage) {
  max_positional_ = max_positional;
  positional_usage_ = std::move(usage);
}

const Flags::Option* Flags::Find(std::string_view name) const {
  for (const auto& o : options_) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

Status Flags::Apply(const Option& opt, std::string_view value, std::string_view source) const {
  Status s = opt.set(value);
  if (!s.ok()) {
    return InvalidArgument("option '" + opt.name + "' from " + std::string(source) + ": " +
                           s.message());
  }
  return Status::Ok();
}

Status Flags::ApplyFile(const std::string& path) const {
  std::ifstream in(path);
  if (!in) return NotFound("config file '" + path + "' cannot be opened");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    return InvalidArgument("config file '" + path + "' is not valid JSON: " + e.what());
  }
  if (!doc.is_object()) {
    return InvalidArgument("config file '" + path + "' must hold a JSON object");
  }
  for (const auto& [key, value] : doc.items()) {
    const Option* opt = Find(key);
    if (opt == nullptr) {
      return InvalidArgument("config file '" + path + "': unknown option '" + key + "'");
    }
    std::string text;
    if (value.is_string())
      text = value.get<std::string>();
    else if (value.is_boolean())
      text = value.get<bool>() ? "true" : "false";
    else if (value.is_number())
      text = value.dump();
    else {
      return InvalidArgument("config file '" + path + "': option '" + key +
                             "' must be a string, number or boolean");
    }
    ZPS_RETURN_IF_ERROR(Apply(*opt, text, "config file '" + path + "'"));
  }
  return Status::Ok();
}

Result<ParseOutcome> Flags::Parse(int argc, const char* const* argv) {
  // Pass 1: find --help and --config before applying anything.
  std::string config_path;
  if (const char* env = std::getenv("ZPS_CONFIG")) config_path = env;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << Help();
      return ParseOutcome::kHelpShown;
    }
    if (a == "--config") {
      if (i + 1 >= argc) return InvalidArgument("--config needs a path");
      config_path = argv[i + 1];
    } else if (a.rfind("--config=", 0) == 0) {
      config_path = std::string(a.substr(9));
    }
  }
  if (!config_path.empty()) ZPS_RETURN_IF_ERROR(ApplyFile(config_path));

  for (const auto& opt : options_) {
    std::string env = EnvName(opt.name);
    if (const char* v = std::getenv(env.c_str())) {
      ZPS_RETURN_IF_ERROR(Apply(opt, v, "environment " + env));
    }
  }

  positional_.clear();
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a.rfind("--", 0) != 0) {
      if (positional_.size() >= max_positional_) {
        return InvalidArgument("unexpected argument '" + std::string(a) + "' (see --help)");
      }
      positional_.emplace_back(a);
      continue;
    }
    std::string_view body = a.substr(2);
    std::string_view name = body;
    std::optional<std::string_view> value;
    if (size_t eq = body.find('='); eq != std::string_view::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
    }
    if (name == "config") {
      if (!value) ++i;
      continue;
    }
    const Option* opt = Find(name);
    if (opt == nullptr) {
      return InvalidArgument("unknown option '--" + std::string(name) + "' (see --help)");
    }
    if (!value) {
      bool next_is_value = i + 1 < argc && std::string_view(argv[i + 1]).rfind("--", 0) != 0;
      if (opt->is_bool && !(next_is_value && ParseBool(argv[i + 1]).ok())) {
        value = "true";
      } else if (!next_is_value) {
        return InvalidArgument("option '--" + std::string(name) + "' needs a value");
      } else {
        value = argv[++i];
      }
    }
    ZPS_RETURN_IF_ERROR(Apply(*opt, *value, "flag --" + std::string(name)));
  }
  return ParseOutcome::kRun;
}

std::string Flags::Help() const {
  std::ostringstream out;
  out << "Usage: " << program_;
  if (max_positional_ > 0) out << ' ' << positional_usage_;
  out << " [options]\n\n" << summary_ << "\n\nOptions (config file < ZPS_* environment < flags):\n";
  out << "  --config PATH\n      JSON config file with option names as keys (env ZPS_CONFIG)\n";
  for (const auto& o : options_) {
    out << "  --" << o.name << (o.is_bool ? "" : "=VALUE") << "\n      " << o.help << " (env "
        << EnvName(o.name) << ", default: " << (o.default_text.empty() ? "\"\"" : o.default_text)
        << ")\n";
  }
  out << "  --help\n      show this help and exit\n";
  return out.str();
}

}  // namespace zps
