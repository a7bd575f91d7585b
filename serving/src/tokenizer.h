// ErnieTokenizer (paddlenlp) in C++: raw UTF-8 text -> input_ids /
// token_type_ids, so a client can send text (KServe v2 BYTES) to a text model.
//
// Loaded from the model's assets/ directory (written by the sentiment task):
// vocab.txt (one token per line, id = line number) and tokenizer.json (the
// settings, special token ids, and the per-code-point tables computed from
// paddlenlp's own predicates with Python's Unicode database; see
// components/tasks/sentiment.py char_tables). The steps are paddlenlp's:
//   the tokenizer's no-split tokens written in the text are kept whole (a
//   published tokenizer's [CLS] etc.; none for a vocabulary built offline);
//   lower-case (whole text); drop NUL/U+FFFD/control characters; white space
//   -> ' '; spaces around CJK ideographs; split on white space; per word:
//   lower-case + NFD + drop combining marks; split off punctuation/symbols;
//   greedy longest-match WordPiece ("##" continuation, [UNK] for a word it
//   cannot cover or longer than 100 characters); [CLS] + tokens + [SEP],
//   truncated (head, or head_tail) and padded with [PAD] = 0 to max_seq_len.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "status.h"

namespace serving {

class Tokenizer {
 public:
  // Reads <assets_dir>/vocab.txt and <assets_dir>/tokenizer.json.
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& assets_dir);

  // Token ids of `text` (valid UTF-8) as the model takes them: exactly
  // max_seq_len() ids, [CLS] first, [SEP] after the last token, 0 after it.
  Status Encode(std::string_view text, int64_t* ids) const;

  // The WordPiece tokens of `text` without [CLS]/[SEP], truncation or padding.
  StatusOr<std::vector<std::string>> Tokenize(std::string_view text) const;

  int64_t max_seq_len() const { return max_seq_len_; }

 private:
  Tokenizer() = default;

  enum CharClass : uint8_t { kOther = 0, kRemove = 1, kSpace = 2, kCjk = 3, kPunct = 4 };
  struct Run {
    uint32_t first, last;
    CharClass cls;
  };

  Status LoadDoc(const nlohmann::json& doc, const std::string& doc_path);
  CharClass ClassOf(uint32_t cp) const;
  void AppendWordPieces(const std::u32string& word,
                        std::vector<int64_t>* ids,
                        std::vector<std::string>* tokens) const;
  Status Split(std::string_view text, std::vector<int64_t>* ids,
               std::vector<std::string>* tokens) const;

  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<Run> runs_;  // sorted, disjoint
  std::unordered_map<uint32_t, std::u32string> lower_;
  std::unordered_map<uint32_t, std::u32string> normalize_;
  std::vector<std::pair<std::string, int64_t>> no_split_;  // text, id
  bool lowercase_ = true;
  std::string truncation_ = "head";
  int64_t max_seq_len_ = 0;
  int64_t cls_id_ = 0, sep_id_ = 0, pad_id_ = 0, unk_id_ = 0;
  size_t max_chars_per_word_ = 100;
  size_t max_piece_chars_ = 1;  // the longest vocabulary piece (without "##"), in characters
};

// UTF-8 <-> code points (strict: overlong forms, surrogates and values beyond
// U+10FFFF are errors).
StatusOr<std::u32string> DecodeUtf8(std::string_view text);
std::string EncodeUtf8(const std::u32string& text);

}  // namespace serving
