// The reference engine's KV cache: vLLM 0.27.1's KVCacheManager over one block pool, for one
// full-attention group or for the hybrid groups of a model whose layers mix sliding-window and
// full attention (gpt-oss). engines/PROTOCOL.md "The KV cache and its block pool" states the
// contract; the code follows vllm/v1/core/block_pool.py, kv_cache_coordinator.py
// (UnitaryKVCacheCoordinator, HybridKVCacheCoordinator), single_type_kv_cache_manager.py
// (FullAttentionManager, SlidingWindowManager) and kv_cache_manager.py (allocate_slots).
//
// Part of the reference engine (a port brings its own), not of the kit: a port's scheduler
// already has its KV cache manager.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace parity::kv {

using Block = std::int64_t;
constexpr Block kNullBlock = 0;  // vLLM's null block: never handed out, freed or cached
using Tables = std::vector<std::vector<Block>>;  // one block list per KV cache group

// One KV cache group's attention type.
struct Group {
    std::int64_t sliding_window = 0;  // 0: full attention
};

struct Settings {
    std::int64_t num_blocks = 0, block_size = 16, max_model_len = 0;
    bool caching = true;  // prefix caching
    bool eagle = false;   // an EAGLE-family drafter: a prefix-cache hit drops its last block
    std::vector<Group> groups{Group{}};
    // VllmConfig.max_in_flight_tokens (concurrent batches x max_num_batched_tokens): a
    // sliding-window group's admission cap counts them (SlidingWindowSpec.max_admission_blocks_per_request).
    std::int64_t max_in_flight_tokens = 0;
};

// Block i's hash of the request being looked up or cached (a full block of its known tokens).
using HashOf = std::function<std::int64_t(std::int64_t)>;

// A prefix-cache hit: its blocks per group (a sliding-window group's skipped blocks are the
// null block) and its tokens.
struct Hit {
    Tables blocks;
    std::int64_t tokens = 0;
    bool empty() const;  // no group has a block (vLLM's empty KVCacheBlocks)
};

// What allocate_slots() needs of the request (KVCacheManager.allocate_slots's arguments).
struct Allocation {
    std::int64_t num_computed = 0;   // request.num_computed_tokens
    std::int64_t num_tokens = 0;     // request.num_tokens (prompt and outputs)
    std::int64_t num_new_tokens = 0;
    std::int64_t num_lookahead = 0;
    std::int64_t num_in_flight = 0;  // request.num_in_flight_tokens
    std::int64_t num_external = 0;   // tokens a KV connector loads
    const Hit* hit = nullptr;        // the local prefix-cache hit of an admission
    bool delay_cache = false;        // an asynchronous load: cache its blocks when it arrives
    bool full_sequence_must_fit = false;
    std::int64_t reserved_blocks = 0;
};

// block_pool.py: the free queue (block 0 is the null block, outside it), the hash map keyed
// by (hash, group), eviction on allocation, and frees in eviction order.
class BlockPool {
  public:
    BlockPool(std::int64_t num_blocks, bool caching);
    std::int64_t num_free() const { return static_cast<std::int64_t>(queue_.size()); }
    std::int64_t num_cached() const { return cached_; }
    std::int64_t ref(Block b) const { return ref_[b]; }
    bool has_hash(Block b) const { return key_[b].first >= 0; }
    std::vector<Block> take(std::int64_t n);  // get_new_blocks: from the head, evicting hashes
    void touch(const std::vector<Block>& blocks);
    void free(const std::vector<Block>& ordered);  // free_blocks: the first is evicted first
    Block lookup(std::int64_t hash, std::int64_t group) const;  // the first block holding it, or -1
    void cache(Block b, std::int64_t hash, std::int64_t group);
    void evict(Block b);  // drops its hash, wherever it is

  private:
    std::vector<std::int64_t> ref_;
    std::vector<std::pair<std::int64_t, std::int64_t>> key_;  // (hash, group); hash -1: none
    std::vector<std::list<Block>::iterator> where_;
    std::list<Block> queue_;
    std::map<std::pair<std::int64_t, std::int64_t>, std::vector<Block>> by_key_;  // first cached first
    std::int64_t cached_ = 0;
    bool caching_;
};

class KvCacheManager {
  public:
    explicit KvCacheManager(const Settings& settings);

    std::size_t num_groups() const { return groups_.size(); }
    // get_computed_blocks: the longest hit of at most `max_length` tokens every group serves.
    Hit find_longest_cache_hit(const HashOf& hash, std::int64_t max_length) const;
    // allocate_slots: the blocks allocated now per group, or nullopt when they do not fit.
    std::optional<Tables> allocate_slots(const std::string& id, const Allocation& a, const HashOf& hash);
    // cache_blocks: the request's blocks fully covered by `num_tokens` get their hash.
    void cache_blocks(const std::string& id, const HashOf& hash, std::int64_t num_tokens);
    // free: every group's blocks, each group last block first.
    void free(const std::string& id);
    // pop_blocks_for_free: the request's blocks, every group's in order, no longer its own
    // but not yet freed; free_blocks() frees them (the first evicted first).
    std::vector<Block> pop_blocks(const std::string& id);
    void free_blocks(const std::vector<Block>& ordered) { pool_.free(ordered); }
    // Drops the hash of each block (the blocks a failed KV load left invalid, evict_blocks).
    void evict_blocks(const std::set<Block>& blocks);
    // remove_skipped_blocks: a sliding-window group frees the blocks wholly before the window of
    // the token after `processed_tokens` (no-op for full attention).
    void remove_skipped_blocks(const std::string& id, std::int64_t processed_tokens);
    // The blocks the request still needs for its whole sequence of `num_tokens`, with
    // `num_computed` computed (Scheduler._request_remaining_blocks).
    std::int64_t remaining_blocks(const std::string& id, std::int64_t num_tokens, std::int64_t num_computed) const;

    Tables blocks(const std::string& id) const;           // its block table per group
    std::int64_t num_blocks_held(const std::string& id) const;  // over every group, null blocks not counted
    std::vector<std::int64_t> num_common_prefix_blocks(const std::string& running_id) const;
    std::int64_t num_free() const { return pool_.num_free(); }
    std::int64_t num_cached() const { return pool_.num_cached(); }
    std::int64_t num_blocks() const { return s_.num_blocks; }
    std::int64_t block_size() const { return s_.block_size; }

  private:
    struct GroupState {
        Group spec;
        std::map<std::string, std::vector<Block>> req_blocks;  // req_to_blocks (entries as vLLM makes them)
        std::map<std::string, std::int64_t> num_cached;         // num_cached_block
        std::int64_t admission_cap = -1;                         // -1: none (full attention)
    };
    std::int64_t skipped_tokens(const GroupState& g, std::int64_t num_computed) const;
    std::int64_t blocks_to_allocate(const GroupState& g, const std::string& id, std::int64_t num_tokens,
                                    const std::vector<Block>& hit, std::int64_t total_computed, bool cap) const;
    void allocate_new_computed_blocks(const std::string& id, const Hit& hit, std::int64_t local, std::int64_t external);
    std::pair<std::vector<Block>, std::int64_t> find_in_group(std::size_t gid, const HashOf& hash,
                                                             std::int64_t max_length, bool drop_eagle) const;

    Settings s_;
    mutable BlockPool pool_;
    std::vector<GroupState> groups_;
};

}  // namespace parity::kv

namespace parity::kv {
// The KV cache groups vLLM 0.27.1's get_kv_cache_groups makes of the model's layers, read from
// `model_dir`/config.json: one full-attention group, or, where `layer_types` mixes
// "sliding_attention" and "full_attention" in equal numbers (gpt-oss), one group per type in
// the order of their first layers. Throws RunError: bad_request where config.json cannot be
// read, unsupported for another mix (vLLM would make several groups of one type).
std::vector<Group> model_kv_cache_groups(const std::string& model_dir);
}  // namespace parity::kv
