// What the RAG demo's sources (rag_demo.cc: the workload and the flags;
// rag_demo_worker.cc; rag_demo_driver.cc: the parent) share beyond
// rag_demo.h; not for use outside tools/demo.
#ifndef TIERKV_TOOLS_DEMO_RAG_DEMO_INTERNAL_H_
#define TIERKV_TOOLS_DEMO_RAG_DEMO_INTERNAL_H_

#include <cstdint>

namespace tierkv::demo {

// Tokens per block (RagLayout's).
inline constexpr int32_t kBlockSize = 16;

}  // namespace tierkv::demo

#endif  // TIERKV_TOOLS_DEMO_RAG_DEMO_INTERNAL_H_
