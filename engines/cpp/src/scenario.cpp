// Typed scenario reader: see include/parity/scenario.hpp.
#include "parity/scenario.hpp"

#include <algorithm>
#include <set>

namespace parity {

namespace {

[[noreturn]] void fail(const std::string& where, const std::string& problem) {
    throw RunError(ErrorKind::bad_request, "scenario." + where + ": " + problem);
}

const json* find(const json& obj, const char* key) {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
}

const json& require(const json& obj, const std::string& where, const char* key) {
    const json* v = find(obj, key);
    if (!v) fail(where + key, "is required");
    return *v;
}

std::int64_t integer(const json& v, const std::string& where, std::int64_t low, std::int64_t high) {
    if (!v.is_number_integer()) fail(where, "must be an integer, got " + v.dump().substr(0, 40));
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
        fail(where, "is out of range");
    std::int64_t x = v.get<std::int64_t>();
    if (x < low || x > high)
        fail(where, "must be between " + std::to_string(low) + " and " + std::to_string(high) + ", got " +
                        std::to_string(x));
    return x;
}

std::string string(const json& v, const std::string& where) {
    if (!v.is_string()) fail(where, "must be a string");
    return v.get<std::string>();
}

bool boolean(const json& v, const std::string& where) {
    if (!v.is_boolean()) fail(where, "must be a boolean");
    return v.get<bool>();
}

const json& object(const json& v, const std::string& where) {
    if (!v.is_object()) fail(where, "must be an object");
    return v;
}

std::vector<std::int64_t> int_list(const json& v, const std::string& where, std::int64_t low, std::int64_t high,
                                   bool allow_empty) {
    if (!v.is_array()) fail(where, "must be an array of integers");
    if (!allow_empty && v.empty()) fail(where, "must not be empty");
    if (v.size() > kMaxList) fail(where, "must hold at most " + std::to_string(kMaxList) + " entries");
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < v.size(); ++i)
        out.push_back(integer(v[i], where + "[" + std::to_string(i) + "]", low, high));
    return out;
}

std::optional<std::int64_t> opt_int(const json& obj, const std::string& where, const char* key, std::int64_t low,
                                    std::int64_t high) {
    const json* v = find(obj, key);
    if (!v || v->is_null()) return std::nullopt;
    return integer(*v, where + key, low, high);
}

std::optional<std::string> opt_string(const json& obj, const std::string& where, const char* key) {
    const json* v = find(obj, key);
    if (!v || v->is_null()) return std::nullopt;
    return string(*v, where + key);
}

SpeculativeConfig read_spec(const json& raw, const std::string& where, bool needs_k) {
    object(raw, where);
    SpeculativeConfig s;
    s.method = string(require(raw, where + ".", "method"), where + ".method");
    if (needs_k)
        s.num_speculative_tokens =
            integer(require(raw, where + ".", "num_speculative_tokens"), where + ".num_speculative_tokens", 1,
                    kMaxTokensLimit);
    s.model = opt_string(raw, where + ".", "model");
    if (const json* v = find(raw, "parallel_drafting"); v && !v->is_null())
        s.parallel_drafting = boolean(*v, where + ".parallel_drafting");
    s.prompt_lookup_max = opt_int(raw, where + ".", "prompt_lookup_max", 1, kMaxTokensLimit);
    s.prompt_lookup_min = opt_int(raw, where + ".", "prompt_lookup_min", 1, kMaxTokensLimit);
    return s;
}

bool valid_id(const std::string& id) {
    if (id.empty() || id.size() > 32) return false;
    for (char c : id)
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    return true;
}

// RepetitionDetectionParams as vLLM's __post_init__ checks them; each size 0 when left out.
standin::Repetition read_repetition(const json& raw, const std::string& where) {
    object(raw, where);
    for (const auto& item : raw.items())
        if (item.key() != "max_pattern_size" && item.key() != "min_pattern_size" && item.key() != "min_count")
            fail(where + "." + item.key(), "unknown key; allowed: max_pattern_size, min_pattern_size, min_count");
    standin::Repetition r;
    r.max_pattern_size = opt_int(raw, where + ".", "max_pattern_size", 0, kMaxPattern).value_or(0);
    r.min_pattern_size = opt_int(raw, where + ".", "min_pattern_size", 0, kMaxPattern).value_or(0);
    r.min_count = opt_int(raw, where + ".", "min_count", 0, kMaxPattern).value_or(0);
    if (r.min_pattern_size > r.max_pattern_size) fail(where + ".min_pattern_size", "must be at most max_pattern_size");
    if (r.max_pattern_size > 0 && r.min_count < 2)
        fail(where + ".min_count", "must be at least 2 when max_pattern_size is above 0");
    return r;
}

// The optional stop conditions: min_tokens (at most max_tokens), eos_token_id, repetition_detection.
void read_stops(const json& r, const std::string& where, std::int64_t vocab_size, RequestSpec& q) {
    q.min_tokens = opt_int(r, where + ".", "min_tokens", 0, kMaxTokensLimit).value_or(0);
    if (q.min_tokens > q.max_tokens) fail(where + ".min_tokens", "must be at most max_tokens");
    q.eos_token_id = opt_int(r, where + ".", "eos_token_id", 0, vocab_size - 1);
    if (const json* v = find(r, "repetition_detection"); v && !v->is_null()) {
        standin::Repetition rep = read_repetition(*v, where + ".repetition_detection");
        if (rep.max_pattern_size > 0) q.repetition_detection = rep;
    }
}

// A request's `external` (a KV connector's remote store), only with engine_args.kv_transfer_config.
void read_external(const json& r, const std::string& where, std::int64_t max_steps, bool connector, RequestSpec& q) {
    const json* v = find(r, "external");
    if (!v || v->is_null()) return;
    if (!connector) fail(where + ".external", "needs engine_args.kv_transfer_config");
    object(*v, where + ".external");
    External e;
    e.tokens = integer(require(*v, where + ".external.", "tokens"), where + ".external.tokens", 1, kMaxTokensLimit);
    e.async_steps = opt_int(*v, where + ".external.", "async_steps", 0, max_steps);
    if (const json* f = find(*v, "fail"); f && !f->is_null()) e.fail = boolean(*f, where + ".external.fail");
    q.external = e;
}

KvTransferConfig read_kv_transfer(const json& raw) {
    const std::string where = "engine_args.kv_transfer_config";
    object(raw, where);
    KvTransferConfig c;
    c.kv_connector = string(require(raw, where + ".", "kv_connector"), where + ".kv_connector");
    if (c.kv_connector != "StandInConnector")
        fail(where + ".kv_connector", "must be StandInConnector (the stand-in's remote KV store)");
    c.kv_role = opt_string(raw, where + ".", "kv_role").value_or("kv_both");
    c.kv_load_failure_policy = opt_string(raw, where + ".", "kv_load_failure_policy").value_or("fail");
    if (c.kv_load_failure_policy != "fail" && c.kv_load_failure_policy != "recompute")
        fail(where + ".kv_load_failure_policy", "must be fail or recompute");
    return c;
}

Workload read_workload(const json& raw, std::int64_t max_model_len, bool connector) {
    object(raw, "workload");
    Workload w;
    w.seed = static_cast<std::uint64_t>(integer(require(raw, "workload.", "seed"), "workload.seed", 0, INT64_MAX));
    w.vocab_size = integer(require(raw, "workload.", "vocab_size"), "workload.vocab_size", 2, kMaxVocabSize);
    w.max_steps = integer(require(raw, "workload.", "max_steps"), "workload.max_steps", 1, kMaxSteps);
    w.max_model_len = max_model_len;
    w.kv_connector = connector;
    if (const json* v = find(raw, "prefixes")) {
        if (!v->is_array() || v->size() > kMaxPrefixes)
            fail("workload.prefixes", "must be an array of at most " + std::to_string(kMaxPrefixes) + " prefixes");
        for (std::size_t i = 0; i < v->size(); ++i) {
            const std::string where = "workload.prefixes[" + std::to_string(i) + "]";
            const json& p = object((*v)[i], where);
            Prefix prefix;
            prefix.name = string(require(p, where + ".", "name"), where + ".name");
            if (!valid_id(prefix.name)) fail(where + ".name", "must be 1-32 characters of A-Z a-z 0-9 _ -");
            for (const auto& other : w.prefixes)
                if (other.name == prefix.name) fail(where + ".name", "duplicate prefix name " + prefix.name);
            prefix.len = integer(require(p, where + ".", "len"), where + ".len", 1, max_model_len);
            w.prefixes.push_back(std::move(prefix));
        }
    }
    const json& reqs = require(raw, "workload.", "requests");
    if (!reqs.is_array() || reqs.empty() || reqs.size() > kMaxRequests)
        fail("workload.requests", "must be an array of 1 to " + std::to_string(kMaxRequests) + " requests");
    std::set<std::string> seen;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
        const std::string where = "workload.requests[" + std::to_string(i) + "]";
        const json& r = object(reqs[i], where);
        RequestSpec q;
        q.id = string(require(r, where + ".", "id"), where + ".id");
        if (!valid_id(q.id)) fail(where + ".id", "must be 1-32 characters of A-Z a-z 0-9 _ -");
        if (!seen.insert(q.id).second) fail(where + ".id", "duplicate request id " + q.id);
        q.arrival_step = integer(require(r, where + ".", "arrival_step"), where + ".arrival_step", 0, w.max_steps - 1);
        q.prefix = opt_string(r, where + ".", "prefix");
        q.continues = opt_string(r, where + ".", "continues");
        if (q.prefix && q.continues) fail(where + ".continues", "a request continues another or starts with a prefix, not both");
        if (q.prefix && std::none_of(w.prefixes.begin(), w.prefixes.end(), [&](const Prefix& p) { return p.name == *q.prefix; }))
            fail(where + ".prefix", "names " + *q.prefix + ", which workload.prefixes does not");
        if (q.continues) {
            auto earlier = std::find_if(w.requests.begin(), w.requests.end(),
                                        [&](const RequestSpec& e) { return e.id == *q.continues; });
            if (earlier == w.requests.end()) fail(where + ".continues", "must name an earlier request");
            if (earlier->abort_step) fail(where + ".continues", "names a request with an abort_step");
            if (earlier->min_tokens > 0)
                fail(where + ".continues", "names a request with min_tokens (its output differs by vLLM release)");
        }
        const bool based = q.prefix || q.continues;
        q.prompt_len = integer(require(r, where + ".", "prompt_len"), where + ".prompt_len", based ? 0 : 1, max_model_len);
        q.max_tokens = integer(require(r, where + ".", "max_tokens"), where + ".max_tokens", 1, max_model_len);
        if (q.prompt_len + q.max_tokens > max_model_len)
            fail(where + ".max_tokens", "prompt_len + max_tokens exceeds engine_args.max_model_len");
        if (const json* v = find(r, "stop_token_ids"))
            q.stop_token_ids = int_list(*v, where + ".stop_token_ids", 0, w.vocab_size - 1, true);
        q.abort_step = opt_int(r, where + ".", "abort_step", q.arrival_step, w.max_steps - 1);
        q.priority = opt_int(r, where + ".", "priority", kMinPriority, kMaxPriority).value_or(0);
        if (const json* v = find(r, "acceptance"))
            q.acceptance = int_list(*v, where + ".acceptance", 0, kMaxAccept, false);
        read_stops(r, where, w.vocab_size, q);
        read_external(r, where, w.max_steps, connector, q);
        if (const json* v = find(r, "lora"); v && !v->is_null()) {
            const json& l = object(*v, where + ".lora");
            Lora lora;
            lora.id = integer(require(l, where + ".lora.", "id"), where + ".lora.id", 1, kMaxLoraId);
            lora.name = string(require(l, where + ".lora.", "name"), where + ".lora.name");
            if (!valid_id(lora.name)) fail(where + ".lora.name", "must be 1-32 characters of A-Z a-z 0-9 _ -");
            for (const auto& e : w.requests)
                if (e.lora && (e.lora->id == lora.id) != (e.lora->name == lora.name))
                    fail(where + ".lora", "names an adapter two ways: one id, one name");
            q.lora = std::move(lora);
        }
        w.requests.push_back(std::move(q));
    }
    return w;
}

}  // namespace

Scenario read_scenario(const json& raw) {
    object(raw, "<scenario>");
    Scenario s;
    s.raw = raw;
    s.name = string(require(raw, "", "name"), "name");
    if (const json* v = find(raw, "sha256")) s.sha256 = string(*v, "sha256");
    const json& a = object(require(raw, "", "engine_args"), "engine_args");
    EngineArgs& e = s.engine_args;
    const std::string w = "engine_args.";
    e.model = string(require(a, w, "model"), w + "model");
    e.load_format = string(require(a, w, "load_format"), w + "load_format");
    e.max_num_seqs = integer(require(a, w, "max_num_seqs"), w + "max_num_seqs", 1, kMaxTokensLimit);
    e.max_num_batched_tokens =
        integer(require(a, w, "max_num_batched_tokens"), w + "max_num_batched_tokens", 1, kMaxTokensLimit);
    e.max_model_len = integer(require(a, w, "max_model_len"), w + "max_model_len", 1, kMaxTokensLimit);
    e.block_size = integer(require(a, w, "block_size"), w + "block_size", 1, kMaxTokensLimit);
    e.enable_prefix_caching = boolean(require(a, w, "enable_prefix_caching"), w + "enable_prefix_caching");
    e.enable_chunked_prefill = boolean(require(a, w, "enable_chunked_prefill"), w + "enable_chunked_prefill");
    if (const json* v = find(a, "async_scheduling"); v && !v->is_null())
        e.async_scheduling = boolean(*v, w + "async_scheduling");
    e.dtype = opt_string(a, w, "dtype");
    e.scheduling_policy = opt_string(a, w, "scheduling_policy");
    e.seed = opt_int(a, w, "seed", 0, INT64_MAX);
    e.max_num_scheduled_tokens = opt_int(a, w, "max_num_scheduled_tokens", 1, kMaxTokensLimit);
    e.long_prefill_token_threshold = opt_int(a, w, "long_prefill_token_threshold", 0, kMaxTokensLimit);
    e.num_gpu_blocks_override = opt_int(a, w, "num_gpu_blocks_override", 1, kMaxTokensLimit);
    if (const json* v = find(a, "speculative_config"); v && !v->is_null())
        e.speculative_config = read_spec(*v, "engine_args.speculative_config", true);
    if (const json* v = find(a, "kv_transfer_config"); v && !v->is_null()) e.kv_transfer_config = read_kv_transfer(*v);
    if (const json* v = find(a, "enable_lora"); v && !v->is_null()) e.enable_lora = boolean(*v, w + "enable_lora");
    e.max_loras = opt_int(a, w, "max_loras", 1, kMaxTokensLimit).value_or(1);
    e.max_lora_rank = opt_int(a, w, "max_lora_rank", 1, kMaxTokensLimit).value_or(16);

    if (const json* v = find(raw, "workload"); v && !v->is_null()) s.workload = read_workload(*v, e.max_model_len, e.kv_transfer_config.has_value());
    if (s.workload && !e.enable_lora)
        for (std::size_t i = 0; i < s.workload->requests.size(); ++i)
            if (s.workload->requests[i].lora)
                fail("workload.requests[" + std::to_string(i) + "].lora", "needs engine_args.enable_lora true");
    if (const json* v = find(raw, "method_matrix"); v && !v->is_null()) {
        object(*v, "method_matrix");
        MethodMatrix m;
        m.ks = int_list(require(*v, "method_matrix.", "ks"), "method_matrix.ks", 1, 64, false);
        const json& rows = require(*v, "method_matrix.", "rows");
        if (!rows.is_array() || rows.size() > kMaxList) fail("method_matrix.rows", "must be an array");
        for (std::size_t i = 0; i < rows.size(); ++i) {
            const std::string where = "method_matrix.rows[" + std::to_string(i) + "]";
            const json& r = object(rows[i], where);
            MethodRow row;
            row.name = string(require(r, where + ".", "name"), where + ".name");
            row.target = opt_string(r, where + ".", "target");
            row.speculative_config =
                read_spec(require(r, where + ".", "speculative_config"), where + ".speculative_config", false);
            m.rows.push_back(std::move(row));
        }
        s.method_matrix = std::move(m);
    }
    if (const json* v = find(raw, "engine"); v && !v->is_null()) {
        object(*v, "engine");
        EngineOptions o;
        if (auto x = opt_int(*v, "engine.", "logprobs", 1, 20)) o.logprobs = *x;
        if (auto x = opt_int(*v, "engine.", "logprob_decimals", 0, 8)) o.logprob_decimals = *x;
        s.engine = o;
    }
    return s;
}

}  // namespace parity
