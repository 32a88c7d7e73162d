// Automatic block sizes: always valid, tables parsed and preferred, the
// nearest entry and the heuristic as fallbacks.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "block_sizes_internal.h"
#include "rpa/rpa.h"
#include "rpa/block_sizes.h"

namespace rpa {
namespace {

BlockSizeConfig Llama(int64_t page_size, int64_t pages_per_seq) {
  return BlockSizeConfig{DType::kBF16, DType::kBF16, 32, 8, 128, page_size, 512, page_size * pages_per_seq};
}

// Unloads any user table when a test ends.
class BlockSizeChoiceTest : public ::testing::Test {
 protected:
  void TearDown() override { LoadTunedBlockSizes(""); }
  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = ::testing::TempDir() + name;
    std::ofstream(path) << text;
    return path;
  }
};

TEST_F(BlockSizeChoiceTest, AutoChoiceIsAlwaysWithinOneAndPagesPerSeq) {
  std::vector<int64_t> pages_per_seq_values;
  for (int64_t p = 1; p <= 64; ++p) pages_per_seq_values.push_back(p);
  for (int64_t p = 65; p <= 4096; p = p * 5 / 4 + 1) pages_per_seq_values.push_back(p);
  pages_per_seq_values.push_back(4096);
  for (int64_t page_size = 1; page_size <= 256; ++page_size) {
    for (int64_t pages_per_seq : pages_per_seq_values) {
      const BlockSizeChoice choice = ChooseBlockSizes(Llama(page_size, pages_per_seq));
      ASSERT_GE(choice.sizes.num_kv_pages_per_block, 1) << page_size << " " << pages_per_seq;
      ASSERT_LE(choice.sizes.num_kv_pages_per_block, pages_per_seq) << page_size << " " << pages_per_seq;
      ASSERT_GE(choice.sizes.num_queries_per_block, 1);
    }
  }
}

TEST_F(BlockSizeChoiceTest, AutoChoicePassesValidationAsAnExplicitValue) {
  // The chosen values, passed back explicitly, never raise the seed's error.
  for (int64_t page_size : {1, 3, 7, 16, 128, 256}) {
    for (int64_t pages_per_seq : {1, 2, 5, 31, 257}) {
      const rpa::BlockSizes sizes = GetTunedBlockSizes(DType::kBF16, DType::kBF16, 32, 8, 128, page_size,
                                                  512, pages_per_seq);
      std::vector<uint16_t> q(2 * 32 * 128), kv(static_cast<size_t>(page_size) * 16 * 128);
      std::vector<int32_t> kv_lens{1}, pages(static_cast<size_t>(pages_per_seq), 0), cu{0, 1}, n{1};
      AttentionOptions options;
      options.num_kv_pages_per_block = sizes.num_kv_pages_per_block;
      options.num_queries_per_block = sizes.num_queries_per_block;
      EXPECT_NO_THROW(
          StaticValidateInputs(TensorView(q.data(), DType::kBF16, {2, 32, 128}),
                               TensorView(kv.data(), DType::kBF16, {1, page_size, 16, 128}),
                               PageTable{TensorView(kv_lens.data(), DType::kI32, {1}),
                                         TensorView(pages.data(), DType::kI32, {1, pages_per_seq}),
                                         TensorView(cu.data(), DType::kI32, {2}),
                                         TensorView(n.data(), DType::kI32, {1})},
                               options));
    }
  }
}

TEST_F(BlockSizeChoiceTest, ZeroPagesPerSeqStillGivesOnePage) {
  EXPECT_EQ(ChooseBlockSizes(Llama(16, 0)).sizes.num_kv_pages_per_block, 1);
}

TEST_F(BlockSizeChoiceTest, VmemLimitShrinksTheChoice) {
  const BlockSizeChoice free = ChooseBlockSizes(Llama(16, 256));
  const BlockSizeChoice tight = ChooseBlockSizes(Llama(16, 256), 16 * 1024);
  // Strictly smaller tiles, neither dimension grown: the limit took effect.
  EXPECT_LT(tight.sizes.num_kv_pages_per_block * tight.sizes.num_queries_per_block,
            free.sizes.num_kv_pages_per_block * free.sizes.num_queries_per_block);
  EXPECT_LE(tight.sizes.num_kv_pages_per_block, free.sizes.num_kv_pages_per_block);
  EXPECT_LE(tight.sizes.num_queries_per_block, free.sizes.num_queries_per_block);
  EXPECT_NE(tight.explanation.find("vmem_limit_bytes=16384"), std::string::npos) << tight.explanation;
}

std::string TableJson(const std::string& cpu, int64_t pages, int64_t queries) {
  internal::TunedTable table;
  table.cpu = cpu;
  table.entries.push_back({Llama(16, 256), {pages, queries}});
  return internal::SerializeTunedTable(table);
}

TEST_F(BlockSizeChoiceTest, UserTableEntryIsUsedAndExplained) {
  ASSERT_TRUE(LoadTunedBlockSizes(WriteFile("good.json", TableJson(CpuModelName(), 5, 24))));
  const BlockSizeChoice choice = ChooseBlockSizes(Llama(16, 256));
  EXPECT_EQ(choice.source, BlockSizeSource::kTable);
  EXPECT_EQ(choice.sizes, (rpa::BlockSizes{5, 24}));
  EXPECT_NE(choice.explanation.find("good.json"), std::string::npos) << choice.explanation;
  // Batch sizes and model lengths match by power-of-two bucket.
  BlockSizeConfig similar = Llama(16, 200);
  similar.max_num_batched_tokens = 300;
  EXPECT_EQ(ChooseBlockSizes(similar).source, BlockSizeSource::kTable);
}

TEST_F(BlockSizeChoiceTest, NearestEntryKeepsTheKvTileInTokens) {
  ASSERT_TRUE(LoadTunedBlockSizes(WriteFile("near.json", TableJson(CpuModelName(), 8, 32))));
  // Page size 64 instead of 16: 8 pages of 16 = 128 tokens = 2 pages of 64.
  const BlockSizeChoice choice = ChooseBlockSizes(Llama(64, 64));
  EXPECT_EQ(choice.source, BlockSizeSource::kNearest);
  EXPECT_EQ(choice.sizes, (rpa::BlockSizes{2, 32}));
}

TEST_F(BlockSizeChoiceTest, TableOfAnotherCpuIsUsedAndSaysSo) {
  ASSERT_TRUE(LoadTunedBlockSizes(WriteFile("other.json", TableJson("Some Other CPU 9000", 3, 16))));
  const BlockSizeChoice choice = ChooseBlockSizes(Llama(16, 256));
  EXPECT_EQ(choice.source, BlockSizeSource::kTable);
  EXPECT_NE(choice.explanation.find("not this CPU"), std::string::npos) << choice.explanation;
}

TEST_F(BlockSizeChoiceTest, UnparsableOrMissingTableIsIgnoredWithAWarningNamingIt) {
  const BlockSizeChoice without = ChooseBlockSizes(Llama(16, 256));
  const std::string bad = WriteFile("bad.json", "{\"format\": \"rpa-tuned-block-sizes\", \"version\": 1, \"entries\": [{]");
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(LoadTunedBlockSizes(bad));
  EXPECT_FALSE(LoadTunedBlockSizes(::testing::TempDir() + "does-not-exist.json"));
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warnings.find("bad.json"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("does-not-exist.json"), std::string::npos) << warnings;
  // Ignored: the choice is the one made with no user table, and cites neither file.
  const BlockSizeChoice after = ChooseBlockSizes(Llama(16, 256));
  EXPECT_EQ(after.sizes, without.sizes);
  EXPECT_EQ(after.source, without.source);
  EXPECT_EQ(after.explanation, without.explanation);
  EXPECT_EQ(after.explanation.find("bad.json"), std::string::npos) << after.explanation;
}

TEST_F(BlockSizeChoiceTest, WrongFormatOrVersionIsRejected) {
  std::string error;
  EXPECT_FALSE(internal::ParseTunedTable("{\"format\": \"x\", \"version\": 1, \"entries\": []}", "t", error));
  EXPECT_NE(error.find("format"), std::string::npos);
  EXPECT_FALSE(internal::ParseTunedTable(
      "{\"format\": \"rpa-tuned-block-sizes\", \"version\": 99, \"entries\": []}", "t", error));
  EXPECT_NE(error.find("version"), std::string::npos);
  EXPECT_TRUE(internal::ParseTunedTable(TableJson("cpu", 1, 1), "t", error)) << error;
}

TEST_F(BlockSizeChoiceTest, HeuristicFollowsTheCacheSize) {
  const BlockSizeChoice small = internal::HeuristicBlockSizes(Llama(16, 256), {32 * 1024, 256 * 1024});
  const BlockSizeChoice large = internal::HeuristicBlockSizes(Llama(16, 256), {48 * 1024, 2 * 1024 * 1024});
  EXPECT_LT(small.sizes.num_kv_pages_per_block, large.sizes.num_kv_pages_per_block);
  EXPECT_NE(small.explanation.find("262144"), std::string::npos) << small.explanation;
}

}  // namespace
}  // namespace rpa
