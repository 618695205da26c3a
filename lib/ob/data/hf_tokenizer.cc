// Reading a tokenizer.json (and tokenizer_config.json): what hf_tokenizer.h
// supports, and one line naming the file and field for the rest. The
// encoder is hf_encoder.cc.
#include "ob/data/hf_tokenizer.h"

#include <unistd.h>

#include <algorithm>

#include "ob/data/json_reader.h"
#include "ob/io/file.h"

namespace ob::data {
namespace {

using Kind = JsonValue::Kind;

// `"text"` for messages.
std::string Quoted(const std::string& s) { return "\"" + s + "\""; }

// A field's value as a boolean: `fallback` when absent or null.
Result<bool> Bool(const JsonValue* v, bool fallback, const std::string& where) {
  if (v == nullptr || v->is_null()) return fallback;
  if (v->kind != Kind::kBool) return Status::DataErr(where + " is " + v->KindName() + ", not a boolean");
  return v->boolean;
}

// A field's value as a string: "" when absent or null.
Result<std::string> Text(const JsonValue* v, const std::string& where) {
  if (v == nullptr || v->is_null()) return std::string();
  if (v->kind != Kind::kString) return Status::DataErr(where + " is " + v->KindName() + ", not a string");
  return v->text;
}

// A component's "type": "" for null (no component).
Result<std::string> TypeOf(const JsonValue& v, const std::string& where) {
  if (v.is_null()) return std::string();
  if (v.kind != Kind::kObject) return Status::DataErr(where + " is " + v.KindName() + ", not an object");
  OB_ASSIGN_OR_RETURN(std::string type, Text(v.Find("type"), where + ".type"));
  if (type.empty()) return Status::DataErr(where + " has no type");
  return type;
}

// The parts of tokenizer.json read as trees (all but the model).
struct Parts {
  JsonValue added_tokens, normalizer, pre_tokenizer, post_processor;
  std::string model_type;
  bool has_model = false;
  bool ignore_merges = false;
  std::vector<std::pair<std::string, uint32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
};

// "model": {"type": "BPE", "vocab": {...}, "merges": [...], ...}. The vocab
// and merges are read straight off the text (they are most of the file).
// Returns "" or what is wrong with a field (the cursor's error() for syntax).
std::string ReadModel(JsonCursor& c, size_t text_size, Parts* p) {
  if (!c.BeginObject()) return "";
  // About what Llama 3's and Qwen3's files hold a byte (a vocabulary entry
  // takes 20 or more, a merge 25 or more): no vector grows and copies its
  // strings again and again.
  p->vocab.reserve(text_size / 64);
  p->merges.reserve(text_size / 32);
  std::string key, a, b, wrong;
  while (c.NextMember(&key)) {
    if ((key == "vocab" && c.Peek() != '{') || (key == "merges" && c.Peek() != '[')) {
      // Another model's (a Unigram's vocab is a list): its type says so.
      if (!c.Skip()) return "";
      if (wrong.empty()) wrong = "model." + key + " is not " + (key == "vocab" ? "an object" : "an array");
    } else if (key == "vocab") {
      if (!c.BeginObject()) return "";
      while (c.NextMember(&a)) {
        uint64_t id = 0;
        const char first = c.Peek();
        if (first < '0' || first > '9') return c.ok() ? "model.vocab[" + Quoted(a) + "] is not an id" : "";
        if (!c.Uint(&id)) return "";
        if (id >= (uint64_t{1} << 31)) return "model.vocab[" + Quoted(a) + "] is not an id below 2^31";
        p->vocab.emplace_back(a, static_cast<uint32_t>(id));
      }
    } else if (key == "merges") {
      if (!c.BeginArray()) return "";
      while (c.NextItem()) {
        auto where = [&] { return "model.merges[" + std::to_string(p->merges.size()) + "]"; };
        if (c.Peek() == '[') {  // ["a", "b"]: the newer form
          if (!c.BeginArray() || !c.NextItem() || !c.String(&a) || !c.NextItem() || !c.String(&b)) {
            return c.ok() ? where() + " is not a pair of tokens" : "";
          }
          if (c.NextItem()) return where() + " is not a pair of tokens";
        } else {  // "a b"
          if (c.Peek() != '"') return c.ok() ? where() + " is not a pair of tokens" : "";
          if (!c.String(&a)) return "";
          const size_t space = a.find(' ');
          if (space == std::string::npos || a.find(' ', space + 1) != std::string::npos) {
            return where() + " is not two tokens separated by one space";
          }
          b = a.substr(space + 1);
          a.resize(space);
        }
        p->merges.emplace_back(a, b);
      }
    } else {
      JsonValue v;
      if (!c.Value(&v)) return "";
      const std::string where = "model." + key;
      if (key == "type") {
        auto t = Text(&v, where);
        if (!t.ok()) return t.status().message();
        p->model_type = *t;
      } else if (key == "ignore_merges") {
        auto t = Bool(&v, false, where);
        if (!t.ok()) return t.status().message();
        p->ignore_merges = *t;
      } else if (key == "byte_fallback") {
        auto t = Bool(&v, false, where);
        if (!t.ok()) return t.status().message();
        if (*t) return "model.byte_fallback true is not supported (byte-level BPE needs no fallback)";
      } else if (key == "dropout") {
        if (!v.is_null() && !(v.kind == Kind::kNumber && v.number == 0)) {
          return "model.dropout is not supported (encoding must be deterministic)";
        }
      } else if (key == "continuing_subword_prefix" || key == "end_of_word_suffix") {
        auto t = Text(&v, where);
        if (!t.ok()) return t.status().message();
        if (!t->empty()) return where + " " + Quoted(*t) + " is not supported";
      }
      // unk_token: every byte has a token, so it is never used; fuse_unk
      // likewise. Other fields are not BPE's concern here.
    }
  }
  return wrong;
}

std::string ReadTop(JsonCursor& c, size_t text_size, Parts* p) {
  if (!c.BeginObject()) return "";
  std::string key;
  while (c.NextMember(&key)) {
    JsonValue* tree = key == "added_tokens"     ? &p->added_tokens
                      : key == "normalizer"     ? &p->normalizer
                      : key == "pre_tokenizer"  ? &p->pre_tokenizer
                      : key == "post_processor" ? &p->post_processor
                                                : nullptr;
    if (key == "model") {
      p->has_model = true;
      if (std::string wrong = ReadModel(c, text_size, p); !wrong.empty() || !c.ok()) return wrong;
    } else if (tree != nullptr) {
      if (!c.Value(tree)) return "";
    } else if (!c.Skip()) {  // version, truncation, padding, decoder: not what encoding needs
      return "";
    }
  }
  c.End();
  return "";
}

// tokenizer_config.json's bos_token / eos_token: a string, or an added
// token's object {"content": ...}.
Result<std::string> ConfigToken(const JsonValue& config, const std::string& key, const std::string& name) {
  const JsonValue* v = config.Find(key);
  if (v != nullptr && v->kind == Kind::kObject) return Text(v->Find("content"), name + ": " + key + ".content");
  return Text(v, name + ": " + key);
}

}  // namespace

Result<HfTokenizer> HfTokenizer::Load(const std::string& tokenizer_json) {
  OB_ASSIGN_OR_RETURN(std::string text, io::ReadFile(tokenizer_json));
  const size_t slash = tokenizer_json.rfind('/');
  const std::string config =
      (slash == std::string::npos ? std::string() : tokenizer_json.substr(0, slash + 1)) + "tokenizer_config.json";
  std::string config_text;
  if (::access(config.c_str(), F_OK) == 0) {
    OB_ASSIGN_OR_RETURN(config_text, io::ReadFile(config));
  }
  return Parse(text, tokenizer_json, config_text, config);
}

Result<HfTokenizer> HfTokenizer::Parse(const std::string& text, const std::string& name,
                                       const std::string& config_text, const std::string& config_name) {
  Parts p;
  JsonCursor c(text);
  const std::string wrong = ReadTop(c, text.size(), &p);
  if (!c.ok()) return Status::DataErr(name + ": not JSON (" + c.error() + ")");
  auto refuse = [&](const std::string& what) { return Status::DataErr(name + ": " + what); };
  if (!p.model_type.empty() && p.model_type != "BPE") {
    return refuse("model.type " + Quoted(p.model_type) + " is not supported (only BPE)");
  }
  if (!wrong.empty()) return refuse(wrong);
  if (!p.has_model) return refuse("no model");
  if (p.model_type.empty() && p.merges.empty()) return refuse("model has no type and no merges: not BPE");

  HfTokenizer t;
  t.ignore_merges_ = p.ignore_merges;
  OB_ASSIGN_OR_RETURN(t.bpe_, Bpe::FromSpelled(p.vocab, p.merges, name + ": model.vocab", [&](size_t i) {
                        return name + ": model.merges[" + std::to_string(i) + "]";
                      }));
  t.vocab_size_ = t.bpe_.vocab_size();

  // normalizer: null, NFC, or a Sequence of at most one NFC.
  OB_ASSIGN_OR_RETURN(std::string norm, TypeOf(p.normalizer, "normalizer"));
  const JsonValue* norm_node = &p.normalizer;
  if (norm == "Sequence") {
    const JsonValue* list = p.normalizer.Find("normalizers");
    if (list == nullptr || list->kind != Kind::kArray || list->items.size() > 1) {
      return refuse("normalizer: a Sequence of more than one normalizer is not supported (only NFC)");
    }
    norm_node = list->items.empty() ? nullptr : &list->items[0];
    norm.clear();
    if (norm_node != nullptr) {
      OB_ASSIGN_OR_RETURN(norm, TypeOf(*norm_node, "normalizer.normalizers[0]"));
    }
  }
  if (norm == "NFC") {
    t.normalizer_ = Normalizer::kNfc;
  } else if (!norm.empty()) {
    return refuse("normalizer " + Quoted(norm) + " is not supported (only NFC or none)");
  }

  // pre_tokenizer: ByteLevel, or a Sequence of [Split, ByteLevel] or [ByteLevel].
  OB_ASSIGN_OR_RETURN(std::string pre, TypeOf(p.pre_tokenizer, "pre_tokenizer"));
  std::vector<const JsonValue*> steps;
  if (pre == "Sequence") {
    const JsonValue* list = p.pre_tokenizer.Find("pretokenizers");
    if (list == nullptr || list->kind != Kind::kArray) return refuse("pre_tokenizer.pretokenizers is not an array");
    for (const JsonValue& s : list->items) steps.push_back(&s);
  } else if (!pre.empty()) {
    steps.push_back(&p.pre_tokenizer);
  }
  bool byte_level = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string where = pre == "Sequence" ? "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]"
                                                : std::string("pre_tokenizer");
    OB_ASSIGN_OR_RETURN(std::string type, TypeOf(*steps[i], where));
    if (type == "Split" && !t.split_ && !byte_level) {
      OB_ASSIGN_OR_RETURN(bool invert, Bool(steps[i]->Find("invert"), false, where + ".invert"));
      if (invert) return refuse(where + ".invert true is not supported");
      OB_ASSIGN_OR_RETURN(std::string behavior, Text(steps[i]->Find("behavior"), where + ".behavior"));
      if (behavior == "Isolated") {
        t.behavior_ = Behavior::kIsolated;
      } else if (behavior == "Removed") {
        t.behavior_ = Behavior::kRemoved;
      } else {
        return refuse(where + ".behavior " + Quoted(behavior) + " is not supported (only Isolated or Removed)");
      }
      const JsonValue* pattern = steps[i]->Find("pattern");
      const JsonValue* regex = pattern != nullptr ? pattern->Find("Regex") : nullptr;
      const JsonValue* literal = pattern != nullptr ? pattern->Find("String") : nullptr;
      const JsonValue* given = regex != nullptr ? regex : literal;
      if (given == nullptr || given->kind != Kind::kString) {
        return refuse(where + ".pattern is not {\"Regex\": ...} or {\"String\": ...}");
      }
      auto compiled = SplitRegex::Compile(given->text, regex == nullptr);
      if (!compiled.ok()) return refuse(where + ".pattern: " + compiled.status().message());
      t.split_ = std::make_shared<const SplitRegex>(std::move(*compiled));
    } else if (type == "ByteLevel" && !byte_level && i + 1 == steps.size()) {
      byte_level = true;
      OB_ASSIGN_OR_RETURN(bool prefix_space,
                          Bool(steps[i]->Find("add_prefix_space"), true, where + ".add_prefix_space"));
      if (prefix_space) return refuse(where + ".add_prefix_space true is not supported");
      OB_ASSIGN_OR_RETURN(t.byte_level_regex_, Bool(steps[i]->Find("use_regex"), true, where + ".use_regex"));
    } else if (type == "Split" || type == "ByteLevel") {
      return refuse("pre_tokenizer: only one Split, then one ByteLevel last, is supported");
    } else {
      return refuse(where + " " + Quoted(type) + " is not supported (only Split and ByteLevel)");
    }
  }
  if (!byte_level) return refuse("pre_tokenizer has no ByteLevel: not a byte-level BPE");
  if (!t.split_ && !t.byte_level_regex_) {
    return refuse("pre_tokenizer: ByteLevel with use_regex false and no Split makes a document one pre-token, "
                  "which is not supported");
  }

  // added_tokens.
  if (!p.added_tokens.is_null() && p.added_tokens.kind != Kind::kArray) return refuse("added_tokens is not an array");
  for (size_t i = 0; i < p.added_tokens.items.size(); ++i) {
    const JsonValue& a = p.added_tokens.items[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    const JsonValue* id = a.Find("id");
    if (id == nullptr || id->kind != Kind::kNumber || id->number < 0 || id->number >= 2147483648.0 ||
        id->number != static_cast<double>(static_cast<uint32_t>(id->number))) {
      return refuse(where + ".id is not an id below 2^31");
    }
    OB_ASSIGN_OR_RETURN(std::string content, Text(a.Find("content"), where + ".content"));
    if (content.empty()) return refuse(where + ".content is empty");
    OB_ASSIGN_OR_RETURN(bool special, Bool(a.Find("special"), false, where + ".special"));
    for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
      OB_ASSIGN_OR_RETURN(bool on, Bool(a.Find(flag), false, where + "." + flag));
      if (on) return refuse(where + " (" + Quoted(content) + "): " + flag + " true is not supported");
    }
    // HF's default: special tokens are matched in the raw text, others in
    // the normalized one; without a normalizer the two are the same.
    OB_ASSIGN_OR_RETURN(bool normalized, Bool(a.Find("normalized"), !special, where + ".normalized"));
    if (normalized && t.normalizer_ != Normalizer::kNone) {
      return refuse(where + " (" + Quoted(content) + "): normalized true under a normalizer is not supported");
    }
    const auto token_id = static_cast<uint32_t>(id->number);
    if (!t.added_id_.emplace(content, token_id).second) {
      return refuse(where + ": " + Quoted(content) + " is given twice");
    }
    t.added_content_[token_id] = content;
    t.added_.push_back({content, token_id, special});
    t.vocab_size_ = std::max(t.vocab_size_, token_id + 1);
  }

  // tokenizer_config.json.
  bool add_bos = false;
  if (!config_text.empty()) {
    JsonValue config;
    JsonCursor cc(config_text);
    if (!cc.Value(&config) || !cc.End()) return Status::DataErr(config_name + ": not JSON (" + cc.error() + ")");
    if (config.kind != Kind::kObject) return Status::DataErr(config_name + ": not a JSON object");
    for (const char* key : {"bos_token", "eos_token"}) {
      OB_ASSIGN_OR_RETURN(std::string content, ConfigToken(config, key, config_name));
      if (content.empty()) continue;
      const int64_t id = t.Id(content);
      if (id < 0) {
        return Status::DataErr(config_name + ": " + key + " " + Quoted(content) + " is not a token of " + name);
      }
      (std::string(key) == "bos_token" ? t.bos_id_ : t.eos_id_) = id;
    }
    OB_ASSIGN_OR_RETURN(add_bos, Bool(config.Find("add_bos_token"), false, config_name + ": add_bos_token"));
  }

  // post_processor: what encode(text) adds before the text.
  OB_ASSIGN_OR_RETURN(std::string post, TypeOf(p.post_processor, "post_processor"));
  std::vector<std::pair<const JsonValue*, std::string>> processors;
  if (post == "Sequence") {
    const JsonValue* list = p.post_processor.Find("processors");
    if (list == nullptr || list->kind != Kind::kArray) return refuse("post_processor.processors is not an array");
    for (size_t i = 0; i < list->items.size(); ++i) {
      processors.emplace_back(&list->items[i], "post_processor.processors[" + std::to_string(i) + "]");
    }
  } else if (!post.empty()) {
    processors.emplace_back(&p.post_processor, "post_processor");
  }
  for (const auto& [proc, where] : processors) {
    OB_ASSIGN_OR_RETURN(std::string type, TypeOf(*proc, where));
    if (type == "ByteLevel") continue;  // offsets only
    if (type != "TemplateProcessing") {
      return refuse(where + " " + Quoted(type) + " is not supported (only ByteLevel and TemplateProcessing)");
    }
    const JsonValue* single = proc->Find("single");
    const JsonValue* specials = proc->Find("special_tokens");
    if (single == nullptr || single->kind != Kind::kArray) return refuse(where + ".single is not an array");
    bool seen_a = false;
    for (const JsonValue& item : single->items) {
      const JsonValue* special = item.Find("SpecialToken");
      const JsonValue* sequence = item.Find("Sequence");
      if (sequence != nullptr) {
        seen_a = true;
        continue;
      }
      if (special == nullptr) return refuse(where + ".single has an item that is neither SpecialToken nor Sequence");
      if (seen_a) return refuse(where + ".single adds tokens after $A, which is not supported (use --eot)");
      OB_ASSIGN_OR_RETURN(std::string token, Text(special->Find("id"), where + ".single[].SpecialToken.id"));
      const JsonValue* entry = specials != nullptr ? specials->Find(token) : nullptr;
      const JsonValue* ids = entry != nullptr ? entry->Find("ids") : nullptr;
      if (ids != nullptr && ids->kind == Kind::kArray) {
        for (const JsonValue& id : ids->items) {
          if (id.kind != Kind::kNumber || id.number < 0 || id.number >= t.vocab_size_) {
            return refuse(where + ".special_tokens[" + Quoted(token) + "].ids has an id outside the vocabulary");
          }
          t.prefix_.push_back(static_cast<uint32_t>(id.number));
        }
      } else {
        const int64_t id = t.Id(token);
        if (id < 0) return refuse(where + ": " + Quoted(token) + " is not a token");
        t.prefix_.push_back(static_cast<uint32_t>(id));
      }
    }
  }
  if (t.prefix_.empty() && add_bos && t.bos_id_ >= 0) t.prefix_.push_back(static_cast<uint32_t>(t.bos_id_));
  return t;
}

int64_t HfTokenizer::Id(const std::string& content) const {
  auto it = added_id_.find(content);
  return it != added_id_.end() ? static_cast<int64_t>(it->second) : bpe_.Id(content);
}

const std::string& HfTokenizer::Bytes(uint32_t id) const {
  auto it = added_content_.find(id);
  return it != added_content_.end() ? it->second : bpe_.Bytes(id);
}

}  // namespace ob::data
