#include "ob/io/json.h"

#include <cstdio>

namespace ob::io {

void AppendJsonString(std::string* out, const std::string& s) {
  out->push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

void AppendUtf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

namespace {

bool Hex4(const std::string& s, size_t* at, uint32_t* out) {
  if (*at + 4 > s.size()) return false;
  uint32_t v = 0;
  for (int k = 0; k < 4; ++k) {
    const char c = s[*at + k];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else return false;
  }
  *at += 4;
  *out = v;
  return true;
}

}  // namespace

std::string ReadJsonString(const std::string& s, size_t* at, std::string* out) {
  size_t& i = *at;
  if (i >= s.size() || s[i] != '"') return "expected a string";
  ++i;
  for (;;) {
    if (i >= s.size()) return "unterminated string";
    const char c = s[i++];
    if (c == '"') return "";
    if (static_cast<unsigned char>(c) < 0x20) {
      --i;
      return "control character in a string";
    }
    if (c != '\\') {
      out->push_back(c);
      continue;
    }
    if (i >= s.size()) return "unterminated string";
    const char e = s[i++];
    switch (e) {
      case '"': case '\\': case '/': out->push_back(e); break;
      case 'b': out->push_back('\b'); break;
      case 'f': out->push_back('\f'); break;
      case 'n': out->push_back('\n'); break;
      case 'r': out->push_back('\r'); break;
      case 't': out->push_back('\t'); break;
      case 'u': {
        uint32_t cp;
        if (!Hex4(s, at, &cp)) return "bad \\u escape";
        if (cp >= 0xdc00 && cp <= 0xdfff) return "lone low surrogate in \\u escape";
        if (cp >= 0xd800 && cp <= 0xdbff) {
          uint32_t lo;
          if (i + 2 > s.size() || s[i] != '\\' || s[i + 1] != 'u') return "high surrogate without its low half in \\u escape";
          i += 2;
          if (!Hex4(s, at, &lo) || lo < 0xdc00 || lo > 0xdfff)
            return "high surrogate without its low half in \\u escape";
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        AppendUtf8(out, cp);
        break;
      }
      default:
        --i;
        return std::string("bad escape '\\") + e + "'";
    }
  }
}

}  // namespace ob::io
