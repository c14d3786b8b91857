// The RAG demo (tools/run demo): its workload has the shape the demo
// promises (Zipf popularity, distinct documents in random order, prompts
// that split into system prompt, documents and question), bad flags are
// refused by name, and a small run with a real tierkvd and two real worker
// processes serves chunks across workers from host and disk, bit-identical
// to what each worker computes alone; with --nodes 2, across two tierkvds
// through a real Redis Cluster.
#include "tools/demo/rag_demo.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "testing/redis_cluster_harness.h"
#include "tests/status_matchers.h"
#include "tools/admin/admin.h"

namespace tierkv::demo {
namespace {

using ::testing::HasSubstr;

RagDemoOptions Small() {
  RagDemoOptions o;
  o.requests = 16;
  o.documents = 8;
  o.docs_per_prompt = 3;
  o.document_tokens = 64;  // 4 blocks.
  o.system_tokens = 40;    // 3 blocks, the last partial.
  o.question_tokens = 8;
  o.chunk_pool_blocks = 9;  // Two documents.
  o.host_bytes = 12 * RagLayout().BlockBytes();
  o.progress = ProgressMode::kNone;
  return o;
}

// Blocks a node counted as kept from its tiers or refused to a load: a
// store with no free host slot, a block evicted before any lower tier had
// it, a promotion that found no free slot, a pin over a worker's share.
// Each can make a worker compute a chunk a tier would otherwise have
// served; in a host tier this small, with two workers pinning at once,
// they happen.
uint64_t BlocksKeptFromATier(const CoordinatorStats& s) {
  const HostTierStats& h = s.host;
  return h.store_skipped + h.stores_failed + h.evicted_unspilled +
         h.promotion_failures + h.quota_pin_refusals + h.quota_event_refusals +
         h.slot_reserve_failures;
}

TEST(RagDemo, WorkloadHasTheShapeItPromises) {
  RagDemoOptions o;
  o.requests = 400;
  const RagWorkload w = GenerateRagWorkload(o);
  ASSERT_EQ(w.requests.size(), 400u);
  std::vector<int> picked(static_cast<size_t>(o.documents));
  std::set<std::pair<int32_t, int32_t>> ordered_pairs;
  for (const RagRequest& r : w.requests) {
    ASSERT_EQ(r.documents.size(), 4u);
    const std::set<int32_t> distinct(r.documents.begin(), r.documents.end());
    EXPECT_EQ(distinct.size(), 4u) << "request " << r.id;
    for (int32_t d : r.documents) ++picked[static_cast<size_t>(d)];
    for (size_t i = 0; i + 1 < r.documents.size(); ++i) {
      ordered_pairs.insert({r.documents[i], r.documents[i + 1]});
    }
    // The prompt splits into the system prompt, its documents, a question.
    StatusOr<AssembledPrompt> p = AssemblePrompt(r.prompt, w.separator);
    ASSERT_THAT(p, IsOk());
    ASSERT_EQ(p->chunks.size(), 5u);
    EXPECT_EQ(p->chunks[0].size(), o.system_tokens);
    for (size_t i = 1; i < 5; ++i) {
      const auto& doc = w.documents[static_cast<size_t>(r.documents[i - 1])];
      EXPECT_TRUE(std::equal(doc.begin(), doc.end(),
                             p->tokens.begin() + p->chunks[i].begin));
    }
    EXPECT_EQ(p->question.size(), o.question_tokens);
  }
  // Zipf: the first document is drawn far more often than the last.
  EXPECT_GT(picked.front(), 4 * picked.back());
  // Random order: some pair of documents comes both ways round.
  int both_ways = 0;
  for (const auto& [a, b] : ordered_pairs)
    both_ways += ordered_pairs.count({b, a});
  EXPECT_GT(both_ways, 0);
  // Deterministic per seed; another seed, another workload.
  EXPECT_EQ(GenerateRagWorkload(o).requests[7].prompt, w.requests[7].prompt);
  o.seed = 2;
  EXPECT_NE(GenerateRagWorkload(o).requests[7].prompt, w.requests[7].prompt);
}

TEST(RagDemo, BadFlagsAreRefusedByName) {
  auto parse = [](std::vector<const char*> args) {
    args.insert(args.begin(), "tierkv-demo");
    return ParseRagDemoFlags(static_cast<int>(args.size()), args.data());
  };
  EXPECT_THAT(parse({}), IsOk());
  EXPECT_THAT(parse({"--workers", "0"}).status().message(),
              HasSubstr("--workers"));
  EXPECT_THAT(
      parse({"--documents", "2", "--docs-per-prompt", "3"}).status().message(),
      HasSubstr("--docs-per-prompt"));
  EXPECT_THAT(parse({"--chunk-pool-blocks", "4"}).status().message(),
              HasSubstr("--chunk-pool-blocks"));
  EXPECT_THAT(parse({"--host-capacity", "lots"}).status().message(),
              HasSubstr("--host-capacity"));
  EXPECT_THAT(parse({"--progress", "fancy"}).status().message(),
              HasSubstr("--progress"));
  EXPECT_THAT(parse({"--socket", "/tmp/x"}).status().message(),
              HasSubstr("worker processes only"));
  EXPECT_THAT(parse({"--nodes", "0"}).status().message(), HasSubstr("--nodes"));
  EXPECT_THAT(parse({"--nodes", "9"}).status().message(), HasSubstr("--nodes"));
  EXPECT_THAT(parse({"--nodes", "4", "--requests", "3"}).status().message(),
              HasSubstr("--requests"));
  EXPECT_THAT(parse({"--redis", "127.0.0.1:7000"}).status().message(),
              HasSubstr("--nodes"));
  StatusOr<RagDemoCommand> nodes = parse({"--nodes", "2"});
  ASSERT_THAT(nodes, IsOk());
  EXPECT_TRUE(nodes->options.verify);
  EXPECT_FALSE(parse({"--no-such-flag"}).ok());
  StatusOr<RagDemoCommand> help = parse({"--help"});
  ASSERT_THAT(help, IsOk());
  EXPECT_THAT(help->help_text, HasSubstr("--docs-per-prompt"));
  EXPECT_THAT(help->help_text, HasSubstr("tierkv-demo prefix"));
}

// The whole demo, small: tierkvd with a 12-block host tier over a disk
// tier, two worker processes.
TEST(RagDemo, TwoWorkersShareChunksThroughHostAndDisk) {
  RagDemoOptions o = Small();
  o.verify = true;
  o.tierkvd_path = TIERKVD_PATH;
  o.worker_path = TIERKV_DEMO_PATH;
  std::ostringstream out, progress;
  StatusOr<RagDemoReport> report = RunRagDemo(o, out, progress);
  ASSERT_THAT(report, IsOk()) << report.status().ToString() << "\n"
                              << progress.str();
  const RagDemoReport& r = *report;
  ASSERT_EQ(r.requests.size(), 16u);
  // Four chunks per request, each from exactly one place.
  EXPECT_EQ(r.pool_hits + r.host_hits + r.disk_hits + r.computed, 16 * 4);
  EXPECT_EQ(r.tier_errors, 0);
  // Nine distinct chunks; a chunk two workers miss at once is computed by
  // both, and one whose blocks a tier could not keep or hand back (counted)
  // is computed again, but nothing else is.
  EXPECT_GE(r.computed, 9);
  EXPECT_LE(r.computed,
            static_cast<int64_t>(2 * 9 + BlocksKeptFromATier(r.stats)))
      << admin::FormatStatsTable(r.stats);
  // Chunks come back from tierkvd's tiers. Which tier serves one depends on
  // how the two workers' requests interleave with the spills, so the split
  // between host and disk is not asserted here: ChunkTierTest's
  // ChunkEvictedFromThePoolComesBackFromHost and
  // ChunksSpilledToDiskComeBackBitExact pin each path down on its own.
  EXPECT_GT(r.host_hits + r.disk_hits, 0);
  EXPECT_GT(r.stats.host.spills, 0u);
  EXPECT_GT(r.stats.host.promotions, 0u);
  // A promotion may still fail for want of a free host slot when both
  // workers pin chunks at once in this tiny host tier: that chunk is
  // computed instead (counted above), never served half-loaded.
  // Chunks from other workers, host and disk change no bit of the logits.
  EXPECT_EQ(r.verified, 16);
  EXPECT_EQ(r.mismatches, 0);
  // Each worker ran its share.
  std::set<int32_t> workers;
  for (const RagRequestResult& q : r.requests) workers.insert(q.worker);
  EXPECT_EQ(workers.size(), 2u);
  for (const char* text :
       {"Chunks served", "disk (tierkvd)", "host -> disk    (spills)",
        "no cache (full prefill)", "speedup",
        "tierkv-admin stats:", "16 of 16 requests bit-identical"}) {
    EXPECT_THAT(out.str(), HasSubstr(text));
  }
}

// --nodes 2: two tierkvds, each with its own host and disk tiers, on one
// Redis Cluster (here the test's, as --redis gives it). Node b runs after
// node a and loads the chunks a computed from the remote tier,
// bit-identical; a router that follows both nodes' KV events rebuilds each
// node's index exactly; the demo leaves nothing in the cluster.
TEST(RagDemo, TwoNodesShareChunksThroughRedisCluster) {
  StatusOr<std::unique_ptr<RedisClusterHarness>> cluster =
      RedisClusterHarness::Start(
          {.masters = 3, .replicas_per_master = 0, .persistence = false});
  ASSERT_THAT(cluster, IsOk());
  RagDemoOptions o = Small();
  o.nodes = 2;
  o.redis_seeds = (*cluster)->Seeds();
  o.verify = true;
  o.tierkvd_path = TIERKVD_PATH;
  o.worker_path = TIERKV_DEMO_PATH;
  std::ostringstream out, progress;
  StatusOr<RagDemoReport> report = RunRagDemo(o, out, progress);
  ASSERT_THAT(report, IsOk()) << report.status().ToString() << "\n"
                              << progress.str();
  const RagDemoReport& r = *report;
  ASSERT_EQ(r.requests.size(), 16u);
  ASSERT_EQ(r.nodes.size(), 2u);
  EXPECT_EQ(r.tier_errors, 0);
  EXPECT_EQ(r.verified, 16);
  EXPECT_EQ(r.mismatches, 0);
  const RagNodeReport& a = r.nodes[0];
  const RagNodeReport& b = r.nodes[1];
  EXPECT_EQ(a.first_request, 0);
  EXPECT_EQ(a.end_request, 8);
  EXPECT_EQ(b.first_request, 8);
  EXPECT_EQ(b.end_request, 16);
  ASSERT_TRUE(a.stats.remote.has_value());
  ASSERT_TRUE(b.stats.remote.has_value());
  EXPECT_GT(a.stats.remote->puts, 0u);
  // b read blocks its own tiers never had: a's.
  EXPECT_GT(b.stats.remote->hits, 0u);
  EXPECT_GT(b.lower_hits, 0);
  EXPECT_EQ(b.stats.remote->checksum_failures, 0u);
  EXPECT_EQ(b.stats.remote->token_mismatches, 0u);
  // b computes only documents no request of a's had, each at most once per
  // worker (two workers can miss one at once), and chunks a block of which
  // a node counted as kept from a tier: never stored or evicted before it
  // was copied down on a, or not promoted into b's host tier for want of a
  // free slot.
  const RagWorkload w = GenerateRagWorkload(o);
  std::set<int32_t> seen_by_a, new_for_b;
  for (const RagRequest& q : w.requests) {
    for (int32_t d : q.documents) {
      if (q.id < 8) {
        seen_by_a.insert(d);
      } else if (!seen_by_a.contains(d)) {
        new_for_b.insert(d);
      }
    }
  }
  EXPECT_LE(b.computed, static_cast<int64_t>(2 * new_for_b.size() +
                                             BlocksKeptFromATier(a.stats) +
                                             BlocksKeptFromATier(b.stats)))
      << "node a:\n"
      << admin::FormatStatsTable(a.stats) << "node b:\n"
      << admin::FormatStatsTable(b.stats);
  // The router saw every node's blocks on every medium, and its index is
  // each node's.
  for (const RagNodeReport& n : r.nodes) {
    EXPECT_TRUE(n.index_matches) << n.name;
    EXPECT_GT(n.batches, 0u) << n.name;
    EXPECT_GT(n.stored[static_cast<size_t>(CacheMedium::kCpu)], 0u) << n.name;
    EXPECT_GT(n.stored[static_cast<size_t>(CacheMedium::kRemote)], 0u)
        << n.name;
  }
  // What the nodes wrote is deleted when the demo ends.
  for (int node = 0; node < (*cluster)->num_nodes(); ++node) {
    EXPECT_THAT((*cluster)->Command(node, {"DBSIZE"}), IsOkAndHolds("0"))
        << "node " << node;
  }
  for (const char* text : {"Requests node by node", "What a router saw",
                           "Where the router would send a request now",
                           "16 of 16 requests bit-identical"}) {
    EXPECT_THAT(out.str(), HasSubstr(text));
  }
}

TEST(RagDemo, MissingTierkvdIsAClearError) {
  RagDemoOptions o = Small();
  o.tierkvd_path = "/nonexistent/tierkvd";
  o.worker_path = TIERKV_DEMO_PATH;
  std::ostringstream out, progress;
  StatusOr<RagDemoReport> report = RunRagDemo(o, out, progress);
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(report.status().message(), HasSubstr("/nonexistent/tierkvd"));
}

}  // namespace
}  // namespace tierkv::demo
