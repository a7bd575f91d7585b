#include "tokenizer.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace serving {
namespace {

using json = nlohmann::json;

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": cannot open");
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

StatusOr<std::unordered_map<uint32_t, std::u32string>> CodePointMap(
    const json& doc, const char* key, const std::string& where) {
  std::unordered_map<uint32_t, std::u32string> out;
  const auto it = doc.find(key);
  if (it == doc.end()) return out;
  if (!it->is_object()) {
    return InvalidArgument(where + ": '" + key + "' must be an object");
  }
  for (const auto& [cp, value] : it->items()) {
    if (!value.is_string()) {
      return InvalidArgument(where + ": '" + key + "' values must be strings");
    }
    ASSIGN_OR_RETURN(auto decoded, DecodeUtf8(value.get<std::string>()));
    out[static_cast<uint32_t>(std::stoul(cp))] = std::move(decoded);
  }
  return out;
}

StatusOr<int64_t> IntField(const json& doc, const char* key,
                           const std::string& where) {
  const auto it = doc.find(key);
  if (it == doc.end() || !it->is_number_integer()) {
    return InvalidArgument(where + ": needs an integer '" + key + "'");
  }
  return it->get<int64_t>();
}

}  // namespace

StatusOr<std::u32string> DecodeUtf8(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    uint32_t cp = 0;
    size_t len = 0;
    if (b0 < 0x80) {
      cp = b0, len = 1;
    } else if ((b0 & 0xE0) == 0xC0) {
      cp = b0 & 0x1F, len = 2;
    } else if ((b0 & 0xF0) == 0xE0) {
      cp = b0 & 0x0F, len = 3;
    } else if ((b0 & 0xF8) == 0xF0) {
      cp = b0 & 0x07, len = 4;
    } else {
      return InvalidArgument("not valid UTF-8: byte " + std::to_string(i));
    }
    if (i + len > text.size()) {
      return InvalidArgument("not valid UTF-8: truncated sequence at byte " +
                             std::to_string(i));
    }
    for (size_t k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      if ((b & 0xC0) != 0x80) {
        return InvalidArgument("not valid UTF-8: byte " + std::to_string(i + k));
      }
      cp = (cp << 6) | (b & 0x3F);
    }
    static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return InvalidArgument("not valid UTF-8: bad code point at byte " +
                             std::to_string(i));
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

std::string EncodeUtf8(const std::u32string& text) {
  std::string out;
  out.reserve(text.size() * 3);
  for (const char32_t c : text) {
    const auto cp = static_cast<uint32_t>(c);
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(
    const std::string& assets_dir) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  const std::string vocab_path = assets_dir + "/vocab.txt";
  ASSIGN_OR_RETURN(const std::string vocab, ReadFile(vocab_path));
  std::istringstream lines(vocab);
  std::string line;
  int64_t id = 0;
  while (std::getline(lines, line)) {
    tok->vocab_[line] = id++;  // as paddlenlp's load_vocabulary: the last duplicate wins
  }
  if (tok->vocab_.empty()) return InvalidArgument(vocab_path + ": empty");
  for (const auto& [token, unused] : tok->vocab_) {
    const std::string_view piece =
        token.compare(0, 2, "##") == 0 ? std::string_view(token).substr(2) : token;
    auto decoded = DecodeUtf8(piece);
    if (decoded.ok()) {
      tok->max_piece_chars_ = std::max(tok->max_piece_chars_, decoded.value().size());
    }
  }

  const std::string doc_path = assets_dir + "/tokenizer.json";
  ASSIGN_OR_RETURN(const std::string text, ReadFile(doc_path));
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) {
    return InvalidArgument(doc_path + ": not a JSON object");
  }
  try {  // a field of the wrong type is an error naming the file, never a crash
    RETURN_IF_ERROR(tok->LoadDoc(doc, doc_path));
  } catch (const std::exception& e) {
    return InvalidArgument(doc_path + ": " + e.what());
  }
  return tok;
}

Status Tokenizer::LoadDoc(const nlohmann::json& doc, const std::string& doc_path) {
  Tokenizer* tok = this;
  ASSIGN_OR_RETURN(tok->max_seq_len_, IntField(doc, "max_seq_len", doc_path));
  if (tok->max_seq_len_ < 2) {
    return InvalidArgument(doc_path + ": max_seq_len must be >= 2");
  }
  const auto no_split = doc.find("no_split_tokens");
  if (no_split != doc.end() && no_split->is_array()) {
    for (const auto& token : *no_split) {
      const std::string name = token.is_string() ? token.get<std::string>() : "";
      const auto it = tok->vocab_.find(name);
      if (it == tok->vocab_.end()) {
        return InvalidArgument(doc_path + ": no_split_tokens entry '" + name +
                               "' is not in vocab.txt");
      }
      tok->no_split_.emplace_back(name, it->second);
    }
  }
  // the longest first, as a trie would match
  std::sort(tok->no_split_.begin(), tok->no_split_.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  ASSIGN_OR_RETURN(tok->pad_id_, IntField(doc, "[PAD]", doc_path));
  ASSIGN_OR_RETURN(tok->cls_id_, IntField(doc, "[CLS]", doc_path));
  ASSIGN_OR_RETURN(tok->sep_id_, IntField(doc, "[SEP]", doc_path));
  ASSIGN_OR_RETURN(tok->unk_id_, IntField(doc, "[UNK]", doc_path));
  tok->lowercase_ = doc.value("do_lower_case", true);
  tok->truncation_ = doc.value("truncation", std::string("head"));
  if (tok->truncation_ != "head" && tok->truncation_ != "head_tail") {
    return InvalidArgument(doc_path + ": truncation must be head or head_tail");
  }
  const auto runs = doc.find("char_classes");
  if (runs == doc.end() || !runs->is_array()) {
    return InvalidArgument(doc_path + ": needs 'char_classes' (written by the "
                           "sentiment task since tokenizer tables exist)");
  }
  for (const auto& run : *runs) {
    if (!run.is_array() || run.size() != 3) {
      return InvalidArgument(doc_path + ": char_classes entries are [first, last, class]");
    }
    tok->runs_.push_back({run[0].get<uint32_t>(), run[1].get<uint32_t>(),
                          static_cast<CharClass>(run[2].get<int>())});
  }
  std::sort(tok->runs_.begin(), tok->runs_.end(),
            [](const Run& a, const Run& b) { return a.first < b.first; });
  for (size_t i = 0; i < tok->runs_.size(); ++i) {
    const Run& run = tok->runs_[i];
    if (run.first > run.last || run.last > 0x10FFFF || run.cls > kPunct ||
        (i > 0 && tok->runs_[i - 1].last >= run.first)) {
      return InvalidArgument(doc_path + ": char_classes must be disjoint [first, last, "
                             "class] runs with first <= last <= 0x10FFFF, class 0..4");
    }
  }
  const int64_t size = static_cast<int64_t>(tok->vocab_.size());
  for (const int64_t special : {tok->pad_id_, tok->cls_id_, tok->sep_id_, tok->unk_id_}) {
    if (special < 0 || special >= size) {
      return InvalidArgument(doc_path + ": special token id " + std::to_string(special) +
                             " is outside vocab.txt's " + std::to_string(size) + " tokens");
    }
  }
  ASSIGN_OR_RETURN(tok->lower_, CodePointMap(doc, "lower", doc_path));
  ASSIGN_OR_RETURN(tok->normalize_, CodePointMap(doc, "normalize", doc_path));
  return Status::Ok();
}

Tokenizer::CharClass Tokenizer::ClassOf(uint32_t cp) const {
  auto it = std::upper_bound(
      runs_.begin(), runs_.end(), cp,
      [](uint32_t value, const Run& run) { return value < run.first; });
  if (it == runs_.begin()) return kOther;
  --it;
  return cp <= it->last ? it->cls : kOther;
}

void Tokenizer::AppendWordPieces(const std::u32string& word,
                                 std::vector<int64_t>* ids,
                                 std::vector<std::string>* tokens) const {
  auto emit = [&](const std::string& token, int64_t id) {
    ids->push_back(id);
    if (tokens != nullptr) tokens->push_back(token);
  };
  if (word.size() > max_chars_per_word_) {
    emit("[UNK]", unk_id_);
    return;
  }
  std::vector<std::pair<std::string, int64_t>> pieces;
  size_t start = 0;
  while (start < word.size()) {
    // no vocabulary piece is longer than max_piece_chars_: longer candidates cannot match
    size_t end = std::min(word.size(), start + max_piece_chars_);
    bool found = false;
    while (start < end) {
      std::string piece = EncodeUtf8(word.substr(start, end - start));
      if (start > 0) piece = "##" + piece;
      const auto it = vocab_.find(piece);
      if (it != vocab_.end()) {
        pieces.emplace_back(std::move(piece), it->second);
        found = true;
        break;
      }
      --end;
    }
    if (!found) {  // the whole word is unknown, as in paddlenlp
      emit("[UNK]", unk_id_);
      return;
    }
    start = end;
  }
  for (const auto& [piece, id] : pieces) emit(piece, id);
}

Status Tokenizer::Split(std::string_view text, std::vector<int64_t>* ids,
                        std::vector<std::string>* tokens) const {
  ASSIGN_OR_RETURN(const std::u32string decoded, DecodeUtf8(text));
  // No-split tokens written in the text are tokens of their own.
  std::vector<std::pair<std::u32string, int64_t>> segments;  // id >= 0: kept whole
  std::vector<std::pair<std::u32string, int64_t>> whole;
  for (const auto& [name, id] : no_split_) {
    ASSIGN_OR_RETURN(auto decoded_name, DecodeUtf8(name));
    whole.emplace_back(std::move(decoded_name), id);
  }
  std::u32string plain;
  for (size_t i = 0; i < decoded.size();) {
    bool matched = false;
    for (const auto& [name, id] : whole) {
      if (!name.empty() && decoded.compare(i, name.size(), name) == 0) {
        segments.emplace_back(std::move(plain), -1);
        plain.clear();
        segments.emplace_back(std::u32string(), id);
        i += name.size();
        matched = true;
        break;
      }
    }
    if (!matched) plain.push_back(decoded[i++]);
  }
  segments.emplace_back(std::move(plain), -1);

  for (const auto& [segment, special] : segments) {
    if (special >= 0) {
      ids->push_back(special);
      if (tokens != nullptr) {
        for (const auto& [name, id] : no_split_) {
          if (id == special) tokens->push_back(name);
        }
      }
      continue;
    }
    // lower-case, clean, space around CJK, split on white space
    std::vector<std::u32string> words(1);
    auto append = [&](char32_t c) {
      const CharClass cls = ClassOf(static_cast<uint32_t>(c));
      if (cls == kRemove) return;
      if (cls == kSpace) {
        if (!words.back().empty()) words.emplace_back();
        return;
      }
      if (cls == kCjk) {
        if (!words.back().empty()) words.emplace_back();
        words.back().push_back(c);
        words.emplace_back();
        return;
      }
      words.back().push_back(c);
    };
    for (const char32_t c : segment) {
      const auto it = lowercase_ ? lower_.find(static_cast<uint32_t>(c)) : lower_.end();
      if (it != lower_.end()) {
        for (const char32_t l : it->second) append(l);
      } else {
        append(c);
      }
    }
    for (const auto& word : words) {
      if (word.empty()) continue;
      std::u32string normalized;
      for (const char32_t c : word) {
        const auto it =
            lowercase_ ? normalize_.find(static_cast<uint32_t>(c)) : normalize_.end();
        if (it != normalize_.end()) {
          normalized += it->second;
        } else {
          normalized.push_back(c);
        }
      }
      // split off punctuation and symbols; white space a normalisation made splits too
      std::u32string current;
      auto flush = [&]() {
        if (!current.empty()) AppendWordPieces(current, ids, tokens);
        current.clear();
      };
      for (const char32_t c : normalized) {
        const CharClass cls = ClassOf(static_cast<uint32_t>(c));
        if (cls == kPunct) {
          flush();
          AppendWordPieces(std::u32string(1, c), ids, tokens);
        } else if (cls == kSpace) {
          flush();
        } else {
          current.push_back(c);
        }
      }
      flush();
    }
  }
  return Status::Ok();
}

StatusOr<std::vector<std::string>> Tokenizer::Tokenize(
    std::string_view text) const {
  std::vector<int64_t> ids;
  std::vector<std::string> tokens;
  RETURN_IF_ERROR(Split(text, &ids, &tokens));
  return tokens;
}

Status Tokenizer::Encode(std::string_view text, int64_t* out) const {
  std::vector<int64_t> ids;
  RETURN_IF_ERROR(Split(text, &ids, nullptr));
  const size_t keep = static_cast<size_t>(max_seq_len_ - 2);
  if (ids.size() > keep) {
    if (truncation_ == "head_tail") {
      const size_t head = keep / 2;
      ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(head),
                ids.end() - static_cast<std::ptrdiff_t>(keep - head));
    } else {
      ids.resize(keep);
    }
  }
  std::fill(out, out + max_seq_len_, pad_id_);
  out[0] = cls_id_;
  std::copy(ids.begin(), ids.end(), out + 1);
  out[ids.size() + 1] = sep_id_;
  return Status::Ok();
}

}  // namespace serving
