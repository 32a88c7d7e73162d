// Automatic block sizes: always valid, tables parsed and preferred, the
// nearest entry and the heuristic as fallbacks.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/block_sizes_internal.h"
#include "rpa/block_sizes.h"
#include "rpa/kernels.h"
#include "rpa/rpa.h"

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

std::string TableJson(const std::string& cpu, int64_t pages, int64_t queries,
                      const BlockSizeConfig& config = Llama(16, 256)) {
  internal::TunedTable table;
  table.sections.resize(1);  // Known by its model name only.
  table.sections[0].cpu.model_name = cpu;
  table.sections[0].entries.push_back({config, {pages, queries}});
  return internal::SerializeTunedTable(table);
}

// A head configuration no shipped section holds: only a user table answers.
BlockSizeConfig Unshipped() {
  return BlockSizeConfig{DType::kBF16, DType::kBF16, 12, 3, 80, 16, 512, 16 * 256};
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
  // Another CPU's exact entry answers where no section of this CPU has the
  // shape (this CPU's nearest entry would win: docs/block_sizes.md).
  ASSERT_TRUE(LoadTunedBlockSizes(
      WriteFile("other.json", TableJson("Some Other CPU 9000", 3, 16, Unshipped()))));
  const BlockSizeChoice choice = ChooseBlockSizes(Unshipped());
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

// The public write (rpa tune's): this CPU's section replaces its earlier
// one, another CPU's is kept, and the file then answers lookups.
TEST_F(BlockSizeChoiceTest, SavedSectionReplacesThisCpusAndKeepsTheOthers) {
  const std::string path = WriteFile("saved.json", TableJson("Some Other CPU 9000", 3, 16, Unshipped()));
  std::remove((::testing::TempDir() + "fresh.json").c_str());
  const std::string fresh = ::testing::TempDir() + "fresh.json";
  const TunedTableUpdate created = SaveTunedBlockSizes(fresh, {{Unshipped(), {6, 8}}});
  EXPECT_FALSE(created.replaced);
  EXPECT_EQ(created.other_sections, 0);

  CheckTunedTableFile(path);
  const TunedTableUpdate first = SaveTunedBlockSizes(path, {{Unshipped(), {4, 16}}});
  EXPECT_FALSE(first.replaced);
  EXPECT_EQ(first.other_sections, 1);
  const TunedTableUpdate second = SaveTunedBlockSizes(path, {{Unshipped(), {5, 32}}});
  EXPECT_TRUE(second.replaced);
  EXPECT_EQ(second.other_sections, 1);

  std::string error;
  const std::optional<internal::TunedTable> table = internal::ReadTunedTable(path, error);
  ASSERT_TRUE(table) << error;
  ASSERT_EQ(table->sections.size(), 2u);
  EXPECT_EQ(table->sections[0].cpu.model_name, "Some Other CPU 9000");
  const internal::TunedSection& mine = table->sections[1];
  EXPECT_EQ(internal::MatchSection(mine.cpu, ThisCpuInfo()), internal::SectionMatch::kThisCpu);
  EXPECT_EQ(mine.measured.size(), 10u) << mine.measured;
  ASSERT_FALSE(mine.kernels.empty());
  EXPECT_EQ(mine.kernels[0].rfind("cpu features: ", 0), 0u) << mine.kernels[0];
  ASSERT_EQ(mine.entries.size(), 1u);
  EXPECT_EQ(mine.entries[0].sizes, (BlockSizes{5, 32}));

  ASSERT_TRUE(LoadTunedBlockSizes(path));
  const BlockSizeChoice choice = ChooseBlockSizes(Unshipped());
  EXPECT_EQ(choice.sizes, (BlockSizes{5, 32}));
  EXPECT_NE(choice.section.find("saved.json"), std::string::npos) << choice.section;
  EXPECT_NE(choice.section.find("this CPU's"), std::string::npos) << choice.section;
}

TEST_F(BlockSizeChoiceTest, SavingOverAFileThatIsNotATableFailsAndLeavesIt) {
  const std::string text = "{\"format\": \"something else\"}";
  const std::string path = WriteFile("not-a-table.json", text);
  for (int save = 0; save < 2; ++save) {
    try {
      if (save) {
        SaveTunedBlockSizes(path, {{Unshipped(), {4, 16}}});
      } else {
        CheckTunedTableFile(path);
      }
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kOption);
      EXPECT_NE(std::string(e.what()).find(path + " is not a tuned block-size table (format"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("It was left as it is"), std::string::npos) << e.what();
    }
  }
  std::ifstream file(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(file), {}), text);
  try {
    SaveTunedBlockSizes(::testing::TempDir() + "no-such-dir/t.json", {{Unshipped(), {4, 16}}});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Cannot write the tuned block-size table"), std::string::npos) << e.what();
  }
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

// ---- Sections per CPU kind.

CpuInfo Cpu(const std::string& vendor, int family, int model, const std::string& features,
            const std::string& name = "A CPU") {
  CpuInfo cpu;
  cpu.vendor = vendor;
  cpu.model_name = name;
  cpu.family = family;
  cpu.model = model;
  cpu.features = features;
  return cpu;
}

const CpuInfo kZen4 = Cpu("AuthenticAMD", 25, 17, "avx512bw avx512bf16 fast-bf16-dot", "AMD EPYC");
const CpuInfo kSapphire = Cpu("GenuineIntel", 6, 143, "avx512bw avx512fp16 avx512bf16 amx-bf16", "Xeon");

// A section of `cpu` whose one entry (the Llama(16, 256) key) says `pages`.
internal::TunedSection Section(const CpuInfo& cpu, int64_t pages) {
  internal::TunedSection section;
  section.cpu = cpu;
  section.measured = "2026-12-02";
  section.kernels = {"decode: test"};
  section.entries.push_back({Llama(16, 256), {pages, 16}});
  return section;
}

internal::TunedTable Table(const std::string& name, std::vector<internal::TunedSection> sections) {
  return {.name = name, .user = false, .sections = std::move(sections)};
}

// The chosen entry's pages (each section's differ) and the explanation.
std::pair<int64_t, std::string> Lookup(const std::vector<internal::TunedTable>& tables, const CpuInfo& cpu,
                                       const BlockSizeConfig& config = Llama(16, 256)) {
  const std::optional<BlockSizeChoice> chosen = internal::ChooseFromTables(tables, config, cpu);
  if (!chosen) return {0, "none"};
  EXPECT_EQ(chosen->section.rfind("section ", 0), 0u) << chosen->section;
  EXPECT_NE(chosen->explanation.find(chosen->section), std::string::npos);
  return {chosen->sizes.num_kv_pages_per_block, chosen->explanation};
}

TEST(SectionMatchTest, RanksVendorFamilyModelAndFeatures) {
  using internal::MatchSection;
  using internal::SectionMatch;
  EXPECT_EQ(MatchSection(kZen4, kZen4), SectionMatch::kThisCpu);
  // Features compare as a set.
  EXPECT_EQ(MatchSection(Cpu("AuthenticAMD", 25, 17, "fast-bf16-dot avx512bf16 avx512bw"), kZen4),
            SectionMatch::kThisCpu);
  EXPECT_EQ(MatchSection(Cpu("AuthenticAMD", 26, 2, kZen4.features), kZen4), SectionMatch::kSameVendorAndFeatures);
  EXPECT_EQ(MatchSection(Cpu("AuthenticAMD", 25, 17, "avx512bw"), kZen4), SectionMatch::kSameVendor);
  EXPECT_EQ(MatchSection(Cpu("GenuineIntel", 25, 17, kZen4.features), kZen4), SectionMatch::kOther);
  // Without a vendor on either side: the model name alone.
  EXPECT_EQ(MatchSection(Cpu("", 0, 0, "", "AMD EPYC"), kZen4), SectionMatch::kThisCpu);
  EXPECT_EQ(MatchSection(Cpu("", 0, 0, "", "AMD EPYC 9R14"), kZen4), SectionMatch::kOther);
  EXPECT_EQ(MatchSection(kZen4, Cpu("", 0, 0, "none", "AMD EPYC")), SectionMatch::kThisCpu);
}

TEST(SectionLookupTest, ThisCpusSectionFirst) {
  const std::vector<internal::TunedTable> tables = {
      Table("t.json", {Section(kSapphire, 1), Section(kZen4, 2)})};
  const auto [pages, why] = Lookup(tables, kZen4);
  EXPECT_EQ(pages, 2);
  EXPECT_NE(why.find("\"AMD EPYC\" (AuthenticAMD family 25 model 17"), std::string::npos) << why;
  EXPECT_NE(why.find("measured 2026-12-02, of t.json, this CPU's (the same vendor, family, model"),
            std::string::npos) << why;
  EXPECT_EQ(Lookup(tables, kSapphire).first, 1);
}

TEST(SectionLookupTest, NearestIsSameVendorAndFeaturesThenSameVendorThenAny) {
  const CpuInfo zen5 = Cpu("AuthenticAMD", 26, 2, kZen4.features);
  const CpuInfo amd_other = Cpu("AuthenticAMD", 25, 1, "avx512bw");
  const CpuInfo other_vendor = Cpu("HygonGenuine", 24, 1, kZen4.features);
  // Each rule against a section placed before the one it must prefer.
  const std::vector<internal::TunedTable> tables = {
      Table("t.json", {Section(kSapphire, 1), Section(amd_other, 3), Section(kZen4, 2)})};
  const auto [zen5_pages, zen5_why] = Lookup(tables, zen5);
  EXPECT_EQ(zen5_pages, 2);
  EXPECT_NE(zen5_why.find("not this CPU's; the nearest: the same vendor and dispatch features, another "
                          "family/model (this CPU: family 26 model 2)"),
            std::string::npos) << zen5_why;
  const auto [amd_pages, amd_why] = Lookup(tables, Cpu("AuthenticAMD", 25, 97, "avx512bw avx512bf16"));
  EXPECT_EQ(amd_pages, 3);
  EXPECT_NE(amd_why.find("the same vendor, other dispatch features (this CPU: avx512bw avx512bf16)"),
            std::string::npos) << amd_why;
  const auto [any_pages, any_why] = Lookup(tables, other_vendor);
  EXPECT_EQ(any_pages, 1);
  EXPECT_NE(any_why.find("not this CPU's nor its vendor's (this CPU: \"A CPU\" (HygonGenuine"),
            std::string::npos) << any_why;
}

TEST(SectionLookupTest, UserTableFirstWithinARankButARankBeforeTheUser) {
  internal::TunedTable user = Table("user.json", {Section(kSapphire, 4)});
  user.user = true;
  const internal::TunedTable shipped = Table("<shipped table>", {Section(kZen4, 2)});
  // This CPU's shipped section beats the user's section of another CPU...
  EXPECT_EQ(Lookup({user, shipped}, kZen4).first, 2);
  // ...and the user's section of this CPU beats the shipped one.
  user.sections.push_back(Section(kZen4, 5));
  const auto [pages, why] = Lookup({user, shipped}, kZen4);
  EXPECT_EQ(pages, 5);
  EXPECT_NE(why.find("of user.json, this CPU's"), std::string::npos) << why;
}

TEST(SectionLookupTest, SectionWithoutTheShapeIsPassedOverAndSaysSo) {
  internal::TunedSection gemma_only = Section(kZen4, 2);
  gemma_only.entries[0].config.head_dim = 256;
  const std::vector<internal::TunedTable> tables = {Table("t.json", {gemma_only, Section(kSapphire, 1)})};
  const auto [pages, why] = Lookup(tables, kZen4);
  EXPECT_EQ(pages, 1);
  EXPECT_NE(why.find("passed over section \"AMD EPYC\""), std::string::npos) << why;
  EXPECT_NE(why.find("no entry of these dtypes, heads and head_dim"), std::string::npos) << why;
  BlockSizeConfig unknown = Llama(16, 256);
  unknown.head_dim = 64;
  EXPECT_FALSE(internal::ChooseFromTables(tables, unknown, kZen4));
}

TEST(SectionLookupTest, ThisCpusNearestEntryBeatsAnotherCpusExactOne) {
  // 8 pages of 16 on this CPU = 2 pages of 64; the other CPU tuned page 64.
  internal::TunedSection other = Section(kSapphire, 7);
  other.entries[0].config = Llama(64, 64);
  const std::vector<internal::TunedTable> tables = {Table("t.json", {other, Section(kZen4, 8)})};
  const std::optional<BlockSizeChoice> chosen = internal::ChooseFromTables(tables, Llama(64, 64), kZen4);
  ASSERT_TRUE(chosen);
  EXPECT_EQ(chosen->source, BlockSizeSource::kNearest);
  EXPECT_EQ(chosen->sizes.num_kv_pages_per_block, 2);
}

TEST_F(BlockSizeChoiceTest, UserSectionOfThisCpuIsTakenAndNamed) {
  ASSERT_TRUE(LoadTunedBlockSizes(WriteFile(
      "this_cpu.json", internal::SerializeTunedTable(Table("", {Section(ThisCpuInfo(), 6)})))));
  const BlockSizeChoice choice = ChooseBlockSizes(Llama(16, 256));
  EXPECT_EQ(choice.source, BlockSizeSource::kTable);
  EXPECT_EQ(choice.sizes.num_kv_pages_per_block, 6);
  EXPECT_NE(choice.explanation.find("this_cpu.json, this CPU's"), std::string::npos) << choice.explanation;
}

TEST_F(BlockSizeChoiceTest, ShippedTableAnswersThePresets) {
  // llama3-8b decode as rpa tune keys it: whichever section this CPU takes
  // holds it.
  BlockSizeConfig decode = Llama(16, 256);
  decode.max_num_batched_tokens = 16;
  const BlockSizeChoice choice = ChooseBlockSizes(decode);
  EXPECT_EQ(choice.source, BlockSizeSource::kTable);
  EXPECT_NE(choice.explanation.find("of <shipped table>"), std::string::npos) << choice.explanation;
}

constexpr const char* kVersion1 = R"({"format": "rpa-tuned-block-sizes", "version": 1, "cpu": "Old CPU",
  "entries": [{"q_dtype": "bfloat16", "kv_dtype": "bfloat16", "num_q_heads": 32, "num_kv_heads": 8,
               "head_dim": 128, "page_size": 16, "max_num_batched_tokens": 512,
               "max_model_len": 4096, "num_kv_pages_per_block": 9, "num_queries_per_block": 32}]})";

TEST(TunedTableTest, Version1IsOneSectionKnownByItsModelName) {
  std::string error;
  const std::optional<internal::TunedTable> table = internal::ParseTunedTable(kVersion1, "v1.json", error);
  ASSERT_TRUE(table) << error;
  ASSERT_EQ(table->sections.size(), 1u);
  const internal::TunedSection& section = table->sections[0];
  EXPECT_EQ(section.cpu.model_name, "Old CPU");
  EXPECT_EQ(section.cpu.vendor, "");
  EXPECT_EQ(section.measured, "");
  EXPECT_TRUE(section.kernels.empty());
  ASSERT_EQ(section.entries.size(), 1u);
  EXPECT_EQ(section.entries[0].sizes, (BlockSizes{9, 32}));
  const auto [pages, why] = Lookup({*table}, Cpu("GenuineIntel", 6, 85, "avx512bw", "Old CPU"));
  EXPECT_EQ(pages, 9);
  EXPECT_NE(why.find("\"Old CPU\" (model name only), of v1.json, this CPU's (the same model name)"),
            std::string::npos) << why;
  // Written back as the current version, the section keeps what it knew.
  const std::optional<internal::TunedTable> again =
      internal::ParseTunedTable(internal::SerializeTunedTable(*table), "v2.json", error);
  ASSERT_TRUE(again) << error;
  EXPECT_EQ(again->sections[0].cpu.model_name, "Old CPU");
  EXPECT_EQ(again->sections[0].entries[0].sizes, (BlockSizes{9, 32}));
}

TEST(TunedTableTest, TunesUpdateKeepsTheOtherSections) {
  const CpuInfo zen5 = Cpu("AuthenticAMD", 26, 2, kZen4.features, "AMD EPYC 9005");
  internal::TunedTable table = Table("t.json", {Section(kSapphire, 1), Section(kZen4, 2), Section(zen5, 3)});
  std::string error;
  // Through the file format, as rpa tune reads and writes it.
  table = *internal::ParseTunedTable(internal::SerializeTunedTable(table), "t.json", error);
  EXPECT_TRUE(internal::PutSection(table, Section(kZen4, 20)));
  EXPECT_FALSE(internal::PutSection(table, Section(Cpu("HygonGenuine", 24, 1, "none"), 30)));
  const std::optional<internal::TunedTable> written =
      internal::ParseTunedTable(internal::SerializeTunedTable(table), "t.json", error);
  ASSERT_TRUE(written) << error;
  std::vector<int64_t> pages;
  for (const internal::TunedSection& s : written->sections) pages.push_back(s.entries[0].sizes.num_kv_pages_per_block);
  EXPECT_EQ(pages, (std::vector<int64_t>{1, 20, 3, 30}));
  EXPECT_EQ(written->sections[0].cpu.model, 143);
  EXPECT_EQ(written->sections[0].measured, "2026-12-02");
  EXPECT_EQ(written->sections[0].kernels, (std::vector<std::string>{"decode: test"}));
}

TEST(TunedTableTest, TuneReplacesAVersion1SectionOfThisCpusName) {
  std::string error;
  internal::TunedTable table = *internal::ParseTunedTable(kVersion1, "v1.json", error);
  table.sections.push_back(Section(Cpu("AuthenticAMD", 25, 17, kZen4.features, "Other name"), 2));
  // This CPU: the v1 section's model name and the second section's CPUID.
  EXPECT_TRUE(internal::PutSection(table, Section(Cpu("AuthenticAMD", 25, 17, kZen4.features, "Old CPU"), 5)));
  ASSERT_EQ(table.sections.size(), 1u);
  EXPECT_EQ(table.sections[0].entries[0].sizes.num_kv_pages_per_block, 5);
}

// A valid version-2 table with one section, as JSON to break field by field.
nlohmann::json ValidTable() {
  return nlohmann::json::parse(internal::SerializeTunedTable(Table("", {Section(kZen4, 2)})));
}

TEST(TunedTableTest, MalformedSectionsAreRejectedNamingTheField) {
  struct Case {
    const char* pointer;  // The field to replace (or remove, for a null value).
    nlohmann::json value;
    const char* message;
  };
  const nlohmann::json missing;  // null: remove the field.
  const std::vector<Case> cases = {
      {"/version", 3, "version must be 1 or 2, got 3"},
      {"/format", "x", "format must be \"rpa-tuned-block-sizes\""},
      {"/sections", missing, "sections is missing"},
      {"/sections", "x", "sections must be an array of sections {cpu, measured, kernels, entries}, got \"x\""},
      {"/sections/0", 7, "sections[0] must be an object {cpu, measured, kernels, entries}, got 7"},
      {"/sections/0/cpu", missing, "sections[0].cpu is missing"},
      {"/sections/0/cpu", "Zen", "sections[0].cpu must be an object {vendor, model_name, family, model, features}, got \"Zen\""},
      {"/sections/0/cpu/vendor", 3, "sections[0].cpu.vendor must be a string, got 3"},
      {"/sections/0/cpu/model_name", missing, "sections[0].cpu.model_name is missing"},
      {"/sections/0/cpu/family", -1, "sections[0].cpu.family must be an integer in [0, 255], got -1"},
      {"/sections/0/cpu/family", "25", "sections[0].cpu.family must be an integer in [0, 255], got \"25\""},
      {"/sections/0/cpu/model", 256, "sections[0].cpu.model must be an integer in [0, 255], got 256"},
      {"/sections/0/cpu/model", 1.5, "sections[0].cpu.model must be an integer in [0, 255], got 1.5"},
      {"/sections/0/cpu/features", nlohmann::json::array(), "sections[0].cpu.features must be a string, got []"},
      {"/sections/0/measured", missing, "sections[0].measured is missing"},
      {"/sections/0/measured", "2026-13-01",
       "sections[0].measured must be a UTC date \"YYYY-MM-DD\" (or \"\": not known), got \"2026-13-01\""},
      {"/sections/0/measured", "yesterday", "sections[0].measured must be a UTC date"},
      {"/sections/0/kernels", "decode: x", "sections[0].kernels must be an array of strings, got \"decode: x\""},
      {"/sections/0/kernels/0", 1, "sections[0].kernels[0] must be a string, got 1"},
      {"/sections/0/entries", missing, "sections[0].entries is missing"},
      {"/sections/0/entries", 5, "sections[0].entries must be an array of entries, got 5"},
      {"/sections/0/entries/0", "e", "sections[0].entries[0] must be an object {q_dtype, kv_dtype, num_q_heads"},
      {"/sections/0/entries/0/q_dtype", "bf17",
       "sections[0].entries[0].q_dtype must name a dtype (\"bfloat16\", \"float32\", ...), got \"bf17\""},
      {"/sections/0/entries/0/kv_dtype", missing, "sections[0].entries[0].kv_dtype is missing"},
      {"/sections/0/entries/0/page_size", 0, "sections[0].entries[0].page_size must be an integer >= 1, got 0"},
      {"/sections/0/entries/0/num_queries_per_block", -4,
       "sections[0].entries[0].num_queries_per_block must be an integer >= 1, got -4"},
      {"/sections/0/entries/0/max_model_len", "4096",
       "sections[0].entries[0].max_model_len must be an integer >= 1, got \"4096\""},
  };
  for (const Case& c : cases) {
    nlohmann::json table = ValidTable();
    const nlohmann::json::json_pointer pointer(c.pointer);
    if (c.value.is_null()) {
      table.at(pointer.parent_pointer()).erase(pointer.back());
    } else {
      table[pointer] = c.value;
    }
    std::string error;
    EXPECT_FALSE(internal::ParseTunedTable(table.dump(), "t.json", error)) << c.pointer;
    EXPECT_NE(error.find(c.message), std::string::npos) << c.pointer << ": " << error;
  }
}

TEST(TunedTableTest, TwoSectionsOfOneCpuAreRejected) {
  nlohmann::json table = ValidTable();
  table["sections"].push_back(table["sections"][0]);
  std::string error;
  EXPECT_FALSE(internal::ParseTunedTable(table.dump(), "t.json", error));
  EXPECT_NE(error.find("sections[1].cpu is the CPU of sections[0] (one section per CPU kind"), std::string::npos)
      << error;
}

TEST(TunedTableTest, MalformedVersion1AndTopLevelAreRejectedNamingTheField) {
  std::string error;
  nlohmann::json v1 = nlohmann::json::parse(kVersion1);
  v1.erase("cpu");
  EXPECT_FALSE(internal::ParseTunedTable(v1.dump(), "t", error));
  EXPECT_EQ(error, "cpu is missing");
  v1 = nlohmann::json::parse(kVersion1);
  v1["entries"][0]["num_kv_heads"] = 0;
  EXPECT_FALSE(internal::ParseTunedTable(v1.dump(), "t", error));
  EXPECT_EQ(error, "entries[0].num_kv_heads must be an integer >= 1, got 0");
  EXPECT_FALSE(internal::ParseTunedTable("[1, 2]", "t", error));
  EXPECT_EQ(error, "the table must be a JSON object, got [1,2]");
}

}  // namespace
}  // namespace rpa
