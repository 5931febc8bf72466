// The reference engine's KV cache manager: see kv_cache_manager.hpp.
#include "kv_cache_manager.hpp"

#include <algorithm>
#include <fstream>
#include <stdexcept>

#include "parity/protocol.hpp"

namespace parity::kv {

namespace {
std::int64_t cdiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
}  // namespace

bool Hit::empty() const {
    return std::all_of(blocks.begin(), blocks.end(), [](const auto& g) { return g.empty(); });
}

// ---- the block pool ------------------------------------------------------------------------

BlockPool::BlockPool(std::int64_t num_blocks, bool caching)
    : ref_(num_blocks, 0), key_(num_blocks, {-1, -1}), where_(num_blocks), caching_(caching) {
    for (Block b = 1; b < num_blocks; ++b) where_[b] = queue_.insert(queue_.end(), b);
}

std::vector<Block> BlockPool::take(std::int64_t n) {
    if (n > num_free()) throw std::logic_error("the block pool has fewer free blocks than asked for");
    std::vector<Block> out;
    for (std::int64_t i = 0; i < n; ++i) {
        const Block b = queue_.front();
        queue_.pop_front();
        evict(b);
        ref_[b] = 1;
        out.push_back(b);
    }
    return out;
}

// A prefix-cache hit: held once more, and out of the free queue if no request held it.
void BlockPool::touch(const std::vector<Block>& blocks) {
    for (Block b : blocks) {
        if (b == kNullBlock) continue;
        if (ref_[b]++ == 0) queue_.erase(where_[b]);
    }
}

// With prefix caching, blocks without a hash go to the head as a group in the given order,
// hashed ones to the tail; without, every block to the tail.
void BlockPool::free(const std::vector<Block>& ordered) {
    std::vector<Block> head;
    for (Block b : ordered) {
        if (b == kNullBlock || --ref_[b] > 0) continue;
        if (caching_ && !has_hash(b)) head.push_back(b);
        else where_[b] = queue_.insert(queue_.end(), b);
    }
    const auto first = queue_.begin();
    for (Block b : head) where_[b] = queue_.insert(first, b);
}

Block BlockPool::lookup(std::int64_t hash, std::int64_t group) const {
    const auto it = by_key_.find({hash, group});
    return it == by_key_.end() ? -1 : it->second.front();
}

void BlockPool::cache(Block b, std::int64_t hash, std::int64_t group) {
    key_[b] = {hash, group};
    by_key_[key_[b]].push_back(b);
    ++cached_;
}

void BlockPool::evict(Block b) {
    if (!has_hash(b)) return;
    auto& holders = by_key_[key_[b]];
    holders.erase(std::find(holders.begin(), holders.end(), b));
    if (holders.empty()) by_key_.erase(key_[b]);
    key_[b] = {-1, -1};
    --cached_;
}

// ---- the manager ---------------------------------------------------------------------------

KvCacheManager::KvCacheManager(const Settings& settings) : s_(settings), pool_(settings.num_blocks, settings.caching) {
    for (const Group& g : s_.groups) {
        GroupState state;
        state.spec = g;
        if (g.sliding_window > 0)  // the last sliding_window - 1 tokens plus those in flight, +1: a window straddles a block
            state.admission_cap =
                cdiv(std::min(g.sliding_window - 1 + s_.max_in_flight_tokens, s_.max_model_len), s_.block_size) + 1;
        groups_.push_back(std::move(state));
    }
}

// SlidingWindowManager.get_num_skipped_tokens: the tokens before the next token's window.
std::int64_t KvCacheManager::skipped_tokens(const GroupState& g, std::int64_t num_computed) const {
    return g.spec.sliding_window > 0 ? std::max<std::int64_t>(0, num_computed - g.spec.sliding_window + 1) : 0;
}

// SingleTypeKVCacheManager.get_num_blocks_to_allocate.
std::int64_t KvCacheManager::blocks_to_allocate(const GroupState& g, const std::string& id, std::int64_t num_tokens,
                                                const std::vector<Block>& hit, std::int64_t total_computed,
                                                bool cap) const {
    std::int64_t required = cdiv(num_tokens, s_.block_size);
    if (cap && g.admission_cap >= 0) required = std::min(required, g.admission_cap);
    const auto held = g.req_blocks.find(id);
    const std::int64_t num_req_blocks = held == g.req_blocks.end() ? 0 : static_cast<std::int64_t>(held->second.size());
    if (g.num_cached.count(id)) return std::max<std::int64_t>(required - num_req_blocks, 0);  // a running request
    const std::int64_t skipped = skipped_tokens(g, total_computed) / s_.block_size;
    const std::int64_t local = static_cast<std::int64_t>(hit.size()) + num_req_blocks;
    const std::int64_t fresh = std::max<std::int64_t>(required - std::max(skipped, local), 0);
    // hit blocks no request holds leave the free queue when touched: they count too
    const std::int64_t skip_hit = std::max<std::int64_t>(0, skipped - num_req_blocks);
    std::int64_t evictable = 0;
    for (std::size_t i = static_cast<std::size_t>(std::min<std::int64_t>(skip_hit, static_cast<std::int64_t>(hit.size())));
         i < hit.size(); ++i)
        evictable += hit[i] != kNullBlock && pool_.ref(hit[i]) == 0;
    return fresh + evictable;
}

// remove_skipped_blocks: a sliding-window group frees the blocks wholly before the window of
// the next token (last first, stopping at a block already freed) and holds the null block in
// their place.
void KvCacheManager::remove_skipped_blocks(const std::string& id, std::int64_t processed_tokens) {
    for (GroupState& g : groups_) {
        const std::int64_t skipped = skipped_tokens(g, processed_tokens);
        if (skipped <= 0) continue;
        auto& blocks = g.req_blocks[id];
        const std::int64_t n = std::min(skipped / s_.block_size, static_cast<std::int64_t>(blocks.size()));
        std::vector<Block> freed;
        for (std::int64_t i = n - 1; i >= 0 && blocks[i] != kNullBlock; --i) {
            freed.push_back(blocks[i]);
            blocks[i] = kNullBlock;
        }
        pool_.free(freed);
    }
}

// KVCacheCoordinator.allocate_new_computed_blocks: every group's hit blocks are touched
// before any group allocates blocks for the external tokens.
void KvCacheManager::allocate_new_computed_blocks(const std::string& id, const Hit& hit, std::int64_t local,
                                                  std::int64_t external) {
    for (const GroupState& g : groups_)
        if (g.num_cached.count(id)) return;  // a running request: no new hits
    const std::int64_t total = local + external;
    for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
        GroupState& g = groups_[gi];
        auto& blocks = g.req_blocks[id];
        const std::int64_t skipped = skipped_tokens(g, total) / s_.block_size;
        const std::vector<Block>& all = hit.blocks[gi];
        std::vector<Block> kept(all.begin() + std::min<std::int64_t>(skipped, static_cast<std::int64_t>(all.size())),
                                all.end());
        if (s_.caching) pool_.touch(kept);
        blocks.assign(static_cast<std::size_t>(skipped), kNullBlock);
        blocks.insert(blocks.end(), kept.begin(), kept.end());
        g.num_cached[id] = static_cast<std::int64_t>(blocks.size());
    }
    if (external <= 0) return;
    for (GroupState& g : groups_) {
        const std::int64_t skipped = skipped_tokens(g, total);
        const std::int64_t ext = skipped > 0 ? std::min(total - skipped, external) : external;
        if (ext <= 0) continue;
        auto& blocks = g.req_blocks[id];
        for (Block b : pool_.take(cdiv(total, s_.block_size) - static_cast<std::int64_t>(blocks.size())))
            blocks.push_back(b);
    }
}

std::optional<Tables> KvCacheManager::allocate_slots(const std::string& id, const Allocation& a, const HashOf& hash) {
    if (a.num_new_tokens == 0 && a.num_external == 0)
        throw std::logic_error("allocate_slots needs new tokens when it loads no external tokens");
    const Hit none{Tables(groups_.size()), 0};
    const Hit& hit = a.hit ? *a.hit : none;
    const std::int64_t local = a.num_computed + hit.tokens;
    const std::int64_t total = std::min(local + a.num_external, s_.max_model_len);

    if (a.full_sequence_must_fit) {  // the whole sequence, a sliding-window group capped
        const std::int64_t full = std::min(a.num_tokens, s_.max_model_len);
        std::int64_t need = 0;
        for (std::size_t gi = 0; gi < groups_.size(); ++gi)
            need += blocks_to_allocate(groups_[gi], id, full, hit.blocks[gi], total, true);
        if (need > pool_.num_free()) return std::nullopt;
    }
    const std::int64_t main_tokens = total + a.num_new_tokens;
    const std::int64_t need_slot = std::min(main_tokens + a.num_lookahead, s_.max_model_len);
    // freed even if the request cannot be scheduled now, before allocating (fewer evictions)
    remove_skipped_blocks(id, std::max<std::int64_t>(0, total - a.num_in_flight));
    std::int64_t need = 0;
    for (std::size_t gi = 0; gi < groups_.size(); ++gi)
        need += blocks_to_allocate(groups_[gi], id, need_slot, hit.blocks[gi], local + a.num_external, false);
    if (need > pool_.num_free() - a.reserved_blocks) return std::nullopt;

    if (!hit.empty() || a.num_external > 0) allocate_new_computed_blocks(id, hit, local, a.num_external);
    Tables added(groups_.size());
    for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
        auto& blocks = groups_[gi].req_blocks[id];
        const std::int64_t more = cdiv(need_slot, s_.block_size) - static_cast<std::int64_t>(blocks.size());
        if (more <= 0) continue;
        added[gi] = pool_.take(more);
        blocks.insert(blocks.end(), added[gi].begin(), added[gi].end());
    }
    // drafts are never cached: at most the request's known tokens
    if (s_.caching && !a.delay_cache) cache_blocks(id, hash, std::min(total + a.num_new_tokens, a.num_tokens));
    return added;
}

void KvCacheManager::cache_blocks(const std::string& id, const HashOf& hash, std::int64_t num_tokens) {
    if (!s_.caching) return;
    const std::int64_t full = num_tokens / s_.block_size;
    for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
        GroupState& g = groups_[gi];
        const auto known = g.num_cached.find(id);
        const std::int64_t from = known == g.num_cached.end() ? 0 : known->second;
        if (from >= full) continue;
        const auto& blocks = g.req_blocks[id];
        for (std::int64_t i = from; i < full; ++i)
            if (blocks[i] != kNullBlock) pool_.cache(blocks[i], hash(i), static_cast<std::int64_t>(gi));
        g.num_cached[id] = full;
    }
}

std::vector<Block> KvCacheManager::pop_blocks(const std::string& id) {
    std::vector<Block> out;
    for (GroupState& g : groups_) {
        if (auto it = g.req_blocks.find(id); it != g.req_blocks.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            g.req_blocks.erase(it);
        }
        g.num_cached.erase(id);
    }
    return out;
}

void KvCacheManager::free(const std::string& id) {
    for (GroupState& g : groups_) {
        const auto it = g.req_blocks.find(id);
        std::vector<Block> blocks;
        if (it != g.req_blocks.end()) {
            blocks.assign(it->second.rbegin(), it->second.rend());
            g.req_blocks.erase(it);
        }
        g.num_cached.erase(id);
        pool_.free(blocks);
    }
}

std::int64_t KvCacheManager::remaining_blocks(const std::string& id, std::int64_t num_tokens,
                                             std::int64_t num_computed) const {
    const std::int64_t full = std::min(num_tokens, s_.max_model_len);
    std::int64_t n = 0;
    for (const GroupState& g : groups_) n += blocks_to_allocate(g, id, full, {}, num_computed, true);
    return n;
}

void KvCacheManager::evict_blocks(const std::set<Block>& blocks) {
    for (Block b : blocks) pool_.evict(b);
}

Tables KvCacheManager::blocks(const std::string& id) const {
    Tables out;
    for (const GroupState& g : groups_) {
        const auto it = g.req_blocks.find(id);
        out.push_back(it == g.req_blocks.end() ? std::vector<Block>{} : it->second);
    }
    return out;
}

std::int64_t KvCacheManager::num_blocks_held(const std::string& id) const {
    std::int64_t n = 0;
    for (const auto& group : blocks(id))
        n += std::count_if(group.begin(), group.end(), [](Block b) { return b != kNullBlock; });
    return n;
}

// The leading blocks of the request held by every request with blocks in that group; 0 for a
// sliding-window group (its leading blocks are null) and without prefix caching.
std::vector<std::int64_t> KvCacheManager::num_common_prefix_blocks(const std::string& running_id) const {
    std::vector<std::int64_t> out(groups_.size(), 0);
    if (!s_.caching) return out;
    for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
        const GroupState& g = groups_[gi];
        if (g.spec.sliding_window > 0) continue;
        const auto it = g.req_blocks.find(running_id);
        // vLLM's defaultdict makes the entry it reads: one more holder
        const std::int64_t holders = static_cast<std::int64_t>(g.req_blocks.size()) + (it == g.req_blocks.end());
        if (it == g.req_blocks.end()) continue;
        for (Block b : it->second) {
            if (pool_.ref(b) != holders) break;
            ++out[gi];
        }
    }
    return out;
}

// One group's lookup (FullAttentionManager / SlidingWindowManager.find_longest_cache_hit,
// alignment = block size): the hit's blocks and tokens.
std::pair<std::vector<Block>, std::int64_t> KvCacheManager::find_in_group(std::size_t gid, const HashOf& hash,
                                                                         std::int64_t max_length,
                                                                         bool drop_eagle) const {
    const std::int64_t bs = s_.block_size;
    const std::int64_t window = groups_[gid].spec.sliding_window;
    const auto group = static_cast<std::int64_t>(gid);
    std::vector<Block> hit;
    if (window <= 0) {  // from the first block to the first miss
        for (std::int64_t i = 0; i < max_length / bs; ++i) {
            const Block b = pool_.lookup(hash(i), group);
            if (b < 0) break;
            hit.push_back(b);
        }
        if (drop_eagle && !hit.empty()) hit.pop_back();
        return {hit, static_cast<std::int64_t>(hit.size()) * bs};
    }
    // Sliding window: from the right, the first run of blocks that covers a window; the
    // blocks before it are null.
    const std::int64_t need = cdiv(window - 1, bs) + (drop_eagle ? 1 : 0);
    const std::int64_t max_blocks = max_length / bs;
    hit.assign(static_cast<std::size_t>(std::max<std::int64_t>(max_blocks, 0)), kNullBlock);
    std::int64_t run = 0;
    bool found = false;
    for (std::int64_t i = max_blocks - 1; i >= 0; --i) {
        const Block b = pool_.lookup(hash(i), group);
        if (b < 0) {
            run = 0;
            continue;
        }
        hit[i] = b;
        if (++run >= need) {
            hit.resize(static_cast<std::size_t>(i + run));
            found = true;
            break;
        }
    }
    if (!found) hit.resize(static_cast<std::size_t>(run));  // the run from the first block
    if (drop_eagle && !hit.empty()) hit.pop_back();
    return {hit, static_cast<std::int64_t>(hit.size()) * bs};
}

// UnitaryKVCacheCoordinator / HybridKVCacheCoordinator.find_longest_cache_hit: full attention
// first, then each other group, until every group accepts the length (one pass for a full
// attention group and one other).
Hit KvCacheManager::find_longest_cache_hit(const HashOf& hash, std::int64_t max_length) const {
    Hit out{Tables(groups_.size()), 0};
    if (!s_.caching) return out;
    if (groups_.size() == 1) {
        auto [blocks, tokens] = find_in_group(0, hash, max_length, s_.eagle);
        out.blocks[0] = std::move(blocks);
        out.tokens = tokens;
        return out;
    }
    std::vector<std::size_t> order;  // full attention first
    for (std::size_t gi = 0; gi < groups_.size(); ++gi)
        if (groups_[gi].spec.sliding_window <= 0) order.push_back(gi);
    for (std::size_t gi = 0; gi < groups_.size(); ++gi)
        if (groups_[gi].spec.sliding_window > 0) order.push_back(gi);
    const bool full_first = groups_[order[0]].spec.sliding_window <= 0;
    const bool simple = groups_.size() == 2 && full_first;
    std::vector<std::optional<std::vector<Block>>> found(groups_.size());
    std::vector<std::int64_t> lengths(groups_.size(), 0);
    std::set<std::size_t> eagle_verified;
    std::int64_t hit_length = max_length;
    for (;;) {
        std::int64_t current = hit_length;
        for (std::size_t idx = 0; idx < order.size(); ++idx) {
            const std::size_t gi = order[idx];
            if (groups_[gi].spec.sliding_window <= 0 && found[gi]) {  // downward-closed: trim only
                current = std::min(current, lengths[gi]);
                continue;
            }
            const bool drop = s_.eagle && !eagle_verified.count(idx);
            const std::int64_t limit = drop ? std::min(current + s_.block_size, max_length) : current;
            auto [blocks, tokens] = find_in_group(gi, hash, limit, drop);
            if (drop) eagle_verified.insert(idx);
            else if (tokens < current) eagle_verified.clear();
            current = tokens;
            found[gi] = std::move(blocks);
            lengths[gi] = tokens;
        }
        if (current >= hit_length) break;
        hit_length = current;
        if (simple) break;
    }
    if (full_first && found[order[0]]) found[order[0]]->resize(std::min<std::size_t>(
        found[order[0]]->size(), static_cast<std::size_t>(cdiv(hit_length, s_.block_size))));
    for (std::size_t gi = 0; gi < groups_.size(); ++gi)
        if (found[gi]) out.blocks[gi] = std::move(*found[gi]);
    out.tokens = hit_length;
    return out;
}

}  // namespace parity::kv

// ---- the model's groups --------------------------------------------------------------------


namespace parity::kv {

std::vector<Group> model_kv_cache_groups(const std::string& model_dir) {
    constexpr std::size_t kMaxConfigBytes = 4u << 20;  // a config.json is a few KiB
    const std::string path = model_dir + "/config.json";
    std::ifstream in(path, std::ios::binary);
    if (!in) throw RunError(ErrorKind::bad_request, "cannot read the model's config.json: " + path);
    std::string text(kMaxConfigBytes + 1, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxConfigBytes)
        throw RunError(ErrorKind::bad_request, "the model's config.json is larger than 4 MiB: " + path);
    const json config = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) throw RunError(ErrorKind::bad_request, "the model's config.json is not a JSON object: " + path);
    // a multimodal config keeps the language model's fields under text_config
    const json& hf = config.contains("text_config") && config["text_config"].is_object() ? config["text_config"] : config;
    const auto types = hf.find("layer_types");
    if (types == hf.end() || !types->is_array()) return {Group{}};
    std::vector<std::string> order;  // attention types, by first layer
    std::map<std::string, std::int64_t> count;
    for (const auto& t : *types) {
        if (!t.is_string()) throw RunError(ErrorKind::bad_request, "config.json: layer_types must be strings");
        const std::string kind = t.get<std::string>();
        if (kind != "sliding_attention" && kind != "full_attention")
            throw RunError(ErrorKind::unsupported, "the reference engine knows sliding_attention and full_attention "
                                                   "layers, not " + kind);
        if (count[kind]++ == 0) order.push_back(kind);
    }
    if (!count.count("sliding_attention")) return {Group{}};
    if (order.size() == 2 && count[order[0]] != count[order[1]])
        throw RunError(ErrorKind::unsupported, "the reference engine makes one KV cache group per attention type: "
                                               "it needs as many sliding-window layers as full-attention ones");
    const auto window = hf.find("sliding_window");
    if (window == hf.end() || !window->is_number_integer() || window->get<std::int64_t>() < 1 ||
        window->get<std::int64_t>() > (std::int64_t{1} << 30))
        throw RunError(ErrorKind::bad_request, "config.json: sliding_window must be a positive integer");
    std::vector<Group> groups;
    for (const auto& kind : order)
        groups.push_back(Group{kind == "sliding_attention" ? window->get<std::int64_t>() : 0});
    return groups;
}

}  // namespace parity::kv
