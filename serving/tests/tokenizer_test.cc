#include "tokenizer.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace serving {
namespace {

namespace fs = std::filesystem;

// A tiny tokenizer: classes and maps as the sentiment task writes them.
class TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tokenizer_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    std::ofstream(dir_ / "vocab.txt")
        << "[PAD]\n[CLS]\n[SEP]\n[MASK]\n[UNK]\n好\n坏\n!\nh\n##i\nab\n##c\ne\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<Tokenizer> Load(const std::string& truncation = "head",
                                  int max_seq_len = 8) {
    nlohmann::json doc = {
        {"max_seq_len", max_seq_len}, {"do_lower_case", true},
        {"truncation", truncation},   {"[PAD]", 0}, {"[CLS]", 1}, {"[SEP]", 2},
        {"[MASK]", 3},                {"[UNK]", 4}, {"no_split_tokens", nlohmann::json::array()},
        // NUL and BEL removed, space/tab white space, CJK, '!' punctuation
        {"char_classes", {{0, 0, 1}, {7, 7, 1}, {9, 9, 2}, {32, 32, 2}, {33, 33, 4},
                          {0x4E00, 0x9FFF, 3}}},
        {"lower", {{"72", "h"}, {"73", "i"}}},             // H, I
        {"normalize", {{"233", "e"}}},                    // é -> e
    };
    std::ofstream(dir_ / "tokenizer.json") << doc.dump();
    auto tok = Tokenizer::Load(dir_.string());
    EXPECT_TRUE(tok.ok()) << tok.status().ToString();
    return tok.ok() ? std::move(tok).value() : nullptr;
  }

  fs::path dir_;
};

std::vector<int64_t> Encode(const Tokenizer& tok, const std::string& text) {
  std::vector<int64_t> ids(static_cast<size_t>(tok.max_seq_len()));
  const Status s = tok.Encode(text, ids.data());
  EXPECT_TRUE(s.ok()) << s.ToString();
  return ids;
}

TEST_F(TokenizerTest, CjkPunctuationWordPiecesAndPadding) {
  auto tok = Load();
  ASSERT_NE(tok, nullptr);
  // 好坏 split as CJK; "HI" lower-cased to "hi" = h ##i; "!" split off
  EXPECT_EQ(Encode(*tok, "好坏 HI!"), (std::vector<int64_t>{1, 5, 6, 8, 9, 7, 2, 0}));
  EXPECT_EQ(*tok->Tokenize("abc\thi"), (std::vector<std::string>{"ab", "##c", "h", "##i"}));
}

TEST_F(TokenizerTest, UnknownWordsAndRemovedCharacters) {
  auto tok = Load();
  ASSERT_NE(tok, nullptr);
  // "abx": ab + (no ##x) -> the whole word is [UNK]; NUL and BEL vanish
  EXPECT_EQ(tok->Tokenize(std::string("ab\x07x ab") + '\0' + "c").value(),
            (std::vector<std::string>{"[UNK]", "ab", "##c"}));
  EXPECT_EQ(*tok->Tokenize(std::string(101, 'h')), (std::vector<std::string>{"[UNK]"}));
}

TEST_F(TokenizerTest, TruncatesHeadOrHeadAndTail) {
  auto head = Load("head", 6);
  auto both = Load("head_tail", 6);
  ASSERT_NE(head, nullptr);
  ASSERT_NE(both, nullptr);
  // 好 好 坏 坏 ! ! -> keep 4
  EXPECT_EQ(Encode(*head, "好好坏坏!!"), (std::vector<int64_t>{1, 5, 5, 6, 6, 2}));
  EXPECT_EQ(Encode(*both, "好好坏坏!!"), (std::vector<int64_t>{1, 5, 5, 7, 7, 2}));
  EXPECT_EQ(Encode(*head, ""), (std::vector<int64_t>{1, 2, 0, 0, 0, 0}));
}

TEST_F(TokenizerTest, RejectsInvalidUtf8AndBadAssets) {
  auto tok = Load();
  ASSERT_NE(tok, nullptr);
  std::vector<int64_t> ids(8);
  EXPECT_FALSE(tok->Encode("\xff\xfe", ids.data()).ok());
  EXPECT_FALSE(tok->Encode("\xc0\xaf", ids.data()).ok());        // overlong '/'
  EXPECT_FALSE(tok->Encode("\xed\xa0\x80", ids.data()).ok());    // a surrogate
  EXPECT_FALSE(tok->Encode("\xe5\xa5", ids.data()).ok());        // cut short
  fs::remove(dir_ / "tokenizer.json");
  EXPECT_EQ(Tokenizer::Load(dir_.string()).status().code(), StatusCode::kNotFound);
}

TEST_F(TokenizerTest, MalformedAssetsAreErrorsNotCrashes) {
  for (const char* doc : {
           R"({"max_seq_len": 8, "[PAD]": 0, "[CLS]": 1, "[SEP]": 2, "[MASK]": 3,
               "[UNK]": 4, "char_classes": [["a", 1, 2]]})",
           R"({"max_seq_len": 8, "[PAD]": 0, "[CLS]": 1, "[SEP]": 2, "[MASK]": 3,
               "[UNK]": 4, "char_classes": [], "lower": {"x": "y"}})",
           R"({"max_seq_len": 8, "[PAD]": 0, "[CLS]": 1, "[SEP]": 2, "[MASK]": 3,
               "[UNK]": 99, "char_classes": []})",
           R"({"max_seq_len": 8, "[PAD]": 0, "[CLS]": 1, "[SEP]": 2, "[MASK]": 3,
               "[UNK]": 4, "char_classes": [[9, 3, 1]]})",
       }) {
    std::ofstream(dir_ / "tokenizer.json") << doc;
    const auto tok = Tokenizer::Load(dir_.string());
    EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument) << doc;
  }
}

TEST_F(TokenizerTest, NormalizesAccentsAfterLowerCasing) {
  auto tok = Load();
  ASSERT_NE(tok, nullptr);
  // "é" -> "e" (normalize); "Hé" -> "he": h, then no "##e" in the vocabulary -> [UNK]
  EXPECT_EQ(tok->Tokenize("\xc3\xa9").value(), (std::vector<std::string>{"e"}));
  EXPECT_EQ(tok->Tokenize("H\xc3\xa9").value(), (std::vector<std::string>{"[UNK]"}));
}

TEST(Utf8Test, RoundTrips) {
  const std::string text = "a\xc3\xa9\xe5\xa5\xbd\xf0\x9f\x98\x80";  // a é 好 😀
  auto decoded = DecodeUtf8(text);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->size(), 4u);
  EXPECT_EQ(EncodeUtf8(*decoded), text);
}

}  // namespace
}  // namespace serving
