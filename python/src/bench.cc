// _bench_store_load: the loop of python/bench/python_bench.py's
// BM_PythonStoreLoad, run in C++ on the same client, so the benchmark
// compares the binding's overhead against the C++ client's on the same
// tierkvd, device tensors and blocks (BM_CppStoreLoad). Keep the two loops
// identical.
#include <pybind11/stl.h>

#include <chrono>
#include <numeric>
#include <string>
#include <vector>

#include "python/src/native.h"

namespace tierkv::python {
namespace {

struct Loop {
  Client& client;
  int32_t blocks;
  std::vector<BlockId> store_blocks;  // [0, blocks)
  std::vector<BlockId> load_blocks;   // [blocks, 2 * blocks)
  RequestId next_request;

  Status CompleteTransfers(size_t count) {
    while (count > 0) {
      std::vector<FinishedTransfer> done =
          client.WaitEvents(std::chrono::seconds(10));
      if (done.empty()) return Status::Unavailable("no copy finished in 10 s");
      for (const FinishedTransfer& f : done) TIERKV_RETURN_IF_ERROR(f.status);
      TIERKV_RETURN_IF_ERROR(client.Complete(done));
      count -= std::min(count, done.size());
    }
    return Status::Ok();
  }

  // Stores `blocks` device blocks under prompt[0, T), then loads them back
  // into other device blocks with a lookup of prompt[0, T + 1).
  Status StoreLoad(std::span<const TokenId> prompt) {
    const auto tokens = static_cast<int32_t>(prompt.size() - 1);
    const RequestId put = next_request++;
    TIERKV_ASSIGN_OR_RETURN(LookupResult miss,
                            client.Lookup(put, prompt.first(tokens)));
    if (miss.hit_tokens != 0) return Status::Internal("a store's prompt hit");
    TIERKV_ASSIGN_OR_RETURN(AllocateResult alloc,
                            client.Allocate(put, store_blocks, 0));
    TIERKV_RETURN_IF_ERROR(alloc.store_status);
    TIERKV_ASSIGN_OR_RETURN(CommitResult commit,
                            client.Commit(put, tokens, store_blocks));
    TIERKV_RETURN_IF_ERROR(commit.store_status);
    TIERKV_RETURN_IF_ERROR(CompleteTransfers(commit.stores.size()));
    TIERKV_RETURN_IF_ERROR(client.Finish(put));

    const RequestId get = next_request++;
    TIERKV_ASSIGN_OR_RETURN(LookupResult hit, client.Lookup(get, prompt));
    if (hit.hit_tokens != tokens) {
      return Status::Internal("a load hit " + std::to_string(hit.hit_tokens) +
                              " of " + std::to_string(tokens) + " tokens");
    }
    TIERKV_ASSIGN_OR_RETURN(AllocateResult load,
                            client.Allocate(get, load_blocks, hit.hit_tokens));
    if (!load.load.has_value()) return Status::Internal("a load loaded none");
    TIERKV_RETURN_IF_ERROR(CompleteTransfers(1));
    return client.Finish(get);
  }
};

// Runs `iterations` store+load rounds on the client's device (at least
// 2 * blocks blocks); prompt i is the tokens [(first_seed + i) * (T + 1),
// +T + 1) with T = blocks * block_size. Returns the seconds they took.
double StoreLoad(const py::handle& py_client, int32_t iterations,
                 int32_t blocks, uint64_t first_seed, RequestId first_request) {
  std::shared_ptr<ClientHandle> h = HandleOf(py_client);
  double seconds = 0;
  Status status = [&] {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(h->mu);
    if (h->client == nullptr) {
      return Status::FailedPrecondition("the client was closed meanwhile");
    }
    Loop loop{.client = *h->client,
              .blocks = blocks,
              .store_blocks = std::vector<BlockId>(blocks),
              .load_blocks = std::vector<BlockId>(blocks),
              .next_request = first_request};
    std::iota(loop.store_blocks.begin(), loop.store_blocks.end(), 0);
    std::iota(loop.load_blocks.begin(), loop.load_blocks.end(), blocks);
    const size_t length =
        static_cast<size_t>(blocks) * h->client->layout().block_size + 1;
    std::vector<TokenId> prompt(length);
    const auto start = std::chrono::steady_clock::now();
    for (int32_t i = 0; i < iterations; ++i) {
      std::iota(prompt.begin(), prompt.end(),
                static_cast<TokenId>((first_seed + i) * length));
      TIERKV_RETURN_IF_ERROR(loop.StoreLoad(prompt));
    }
    seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    return Status::Ok();
  }();
  ThrowIfError(status);
  return seconds;
}

}  // namespace

void RegisterBench(py::module_& m) {
  m.def("_bench_store_load", &StoreLoad, py::arg("client"),
        py::arg("iterations"), py::arg("blocks"), py::arg("first_seed"),
        py::arg("first_request"),
        "BM_CppStoreLoad's loop (python/bench/python_bench.py): seconds for "
        "`iterations` rounds of storing `blocks` device blocks and loading "
        "them back, in C++ on the client's device.");
}

}  // namespace tierkv::python
