// paddle-mlops-tokenize ASSETS_DIR: one JSON string per input line (a text)
// -> one JSON array per output line (its max_seq_len token ids), using the
// server's tokenizer. What tests/test_sentiment.py compares with paddlenlp.
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: paddle-mlops-tokenize ASSETS_DIR < texts.jsonl\n";
    return 2;
  }
  auto tokenizer = serving::Tokenizer::Load(argv[1]);
  if (!tokenizer.ok()) {
    std::cerr << "error: " << tokenizer.status().message() << "\n";
    return 1;
  }
  const auto& tok = *tokenizer.value();
  std::vector<int64_t> ids(static_cast<size_t>(tok.max_seq_len()));
  std::string line;
  size_t number = 0;
  while (std::getline(std::cin, line)) {
    ++number;
    const auto text = nlohmann::json::parse(line, nullptr, false);
    if (!text.is_string()) {
      std::cerr << "error: line " << number << ": not a JSON string\n";
      return 1;
    }
    const auto status = tok.Encode(text.get<std::string>(), ids.data());
    if (!status.ok()) {
      std::cerr << "error: line " << number << ": " << status.message() << "\n";
      return 1;
    }
    std::cout << nlohmann::json(ids).dump() << "\n";
  }
  return 0;
}
