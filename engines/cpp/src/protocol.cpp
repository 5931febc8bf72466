// Protocol v3 framing and messages: see include/parity/protocol.hpp and engines/PROTOCOL.md.
#include "parity/protocol.hpp"

#include <cmath>
#include <utility>

namespace parity {

const std::vector<std::string> kLayers = {"config",        "steps",        "outputs",       "methods",
                                          "engine_config", "engine_steps", "engine_outputs"};

const char* to_string(ErrorKind kind) {
    switch (kind) {
        case ErrorKind::unsupported: return "unsupported";
        case ErrorKind::bad_request: return "bad_request";
        case ErrorKind::internal: return "internal";
    }
    return "internal";
}

LineReader::Status LineReader::next(std::string& line, std::size_t& length) {
    line.clear();
    length = 0;
    bool any = false;
    for (;;) {
        int c = std::getc(in_);
        if (c == EOF) {
            if (!any) return Status::eof;
            break;  // a last line without '\n'
        }
        any = true;
        if (c == '\n') break;
        ++length;
        if (length <= limit_) line.push_back(static_cast<char>(c));
    }
    if (length > limit_) {
        line.clear();
        line.shrink_to_fit();
        return Status::too_long;
    }
    return Status::line;
}

namespace {

std::string preview(const std::string& line) {
    std::string out;
    for (std::size_t i = 0; i < line.size() && i < 200; ++i) {
        unsigned char c = static_cast<unsigned char>(line[i]);
        out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
    }
    return "'" + out + (line.size() > 200 ? "'..." : "'");
}

std::string type_name(const json& value) {
    if (value.is_object()) return "object";
    if (value.is_array()) return "array";
    if (value.is_string()) return "string";
    if (value.is_boolean()) return "boolean";
    if (value.is_number_integer()) return "integer";
    if (value.is_number()) return "number";
    if (value.is_null()) return "null";
    return "other";
}

// Every number must be finite (1e400 already fails in the parser; this also catches any
// float that slipped through as inf/nan).
void check_finite(const json& root) {
    std::vector<const json*> stack{&root};
    while (!stack.empty()) {
        const json* value = stack.back();
        stack.pop_back();
        if (value->is_number_float() && !std::isfinite(value->get<double>()))
            throw ProtocolError("expected finite numbers, got a non-finite one");
        if (value->is_structured())
            for (const auto& item : *value) stack.push_back(&item);
    }
}

// The required fields of each message type and the JSON types they may have.
enum class T { string, integer, array, object, string_or_null };
const std::map<std::string, std::vector<std::pair<std::string, T>>>& schema() {
    static const std::map<std::string, std::vector<std::pair<std::string, T>>> s = {
        {"hello", {{"protocol", T::integer}, {"engine", T::string}, {"version", T::string},
                   {"capabilities", T::array}}},
        {"run", {{"id", T::string}, {"scenario", T::object}, {"layers", T::array}}},
        {"record", {{"id", T::string}, {"layer", T::string}, {"seq", T::integer}, {"data", T::object}}},
        {"done", {{"id", T::string}, {"records", T::integer}}},
        {"error", {{"id", T::string_or_null}, {"kind", T::string}, {"message", T::string}}},
        {"shutdown", {}},
    };
    return s;
}

bool has_type(const json& v, T t) {
    switch (t) {
        case T::string: return v.is_string();
        case T::integer: return v.is_number_integer();  // booleans are not numbers here
        case T::array: return v.is_array();
        case T::object: return v.is_object();
        case T::string_or_null: return v.is_string() || v.is_null();
    }
    return false;
}

const char* t_name(T t) {
    switch (t) {
        case T::string: return "str";
        case T::integer: return "int";
        case T::array: return "list";
        case T::object: return "dict";
        case T::string_or_null: return "str/null";
    }
    return "?";
}

}  // namespace

void check_message(const json& message, const std::vector<std::string>& expect) {
    if (!message.is_object()) throw ProtocolError("expected a JSON object, got " + type_name(message));
    auto it = message.find("type");
    if (it == message.end() || !it->is_string() || !schema().count(it->get<std::string>()))
        throw ProtocolError("expected a message type in [done, error, hello, record, run, shutdown], got " +
                            (it == message.end() ? std::string("nothing") : it->dump().substr(0, 80)));
    const std::string type = it->get<std::string>();
    if (!expect.empty()) {
        bool ok = false;
        std::string names;
        for (const auto& e : expect) {
            ok |= (e == type);
            names += (names.empty() ? "" : " or ") + e;
        }
        if (!ok) throw ProtocolError("expected a " + names + " message, got '" + type + "'");
    }
    for (const auto& [field, t] : schema().at(type)) {
        auto f = message.find(field);
        if (f == message.end() || !has_type(*f, t))
            throw ProtocolError("expected " + type + "." + field + " of type " + t_name(t) + ", got " +
                                (f == message.end() ? std::string("nothing") : f->dump().substr(0, 80)));
    }
}

json decode(const std::string& line, const std::vector<std::string>& expect) {
    if (line.size() > kMaxLineBytes)
        throw ProtocolError("expected a line of at most " + std::to_string(kMaxLineBytes) + " bytes, got " +
                            std::to_string(line.size()));
    // nlohmann skips a UTF-8 byte-order mark; the protocol forbids one.
    if (line.size() >= 3 && static_cast<unsigned char>(line[0]) == 0xEF &&
        static_cast<unsigned char>(line[1]) == 0xBB && static_cast<unsigned char>(line[2]) == 0xBF)
        throw ProtocolError("expected a JSON object on one line, got a byte-order mark");
    // The callback bounds nesting while parsing (the parser itself is not recursive): a
    // container at callback depth d is at protocol depth d + 1.
    auto bound = [](int depth, json::parse_event_t event, json&) {
        if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
            depth + 1 >= kMaxDepth)
            throw ProtocolError("expected a message nested at most " + std::to_string(kMaxDepth) +
                                " levels deep, got deeper");
        return true;
    };
    json message;
    try {
        // Strings are checked for well-formed UTF-8 and paired surrogates by the parser;
        // NaN/Infinity are not JSON; numbers overflowing a double throw out_of_range.
        message = json::parse(line, bound, /*allow_exceptions=*/true, /*ignore_comments=*/false);
    } catch (const ProtocolError&) {
        throw;
    } catch (const json::exception& exc) {
        throw ProtocolError("expected a JSON object on one line, got " + preview(line) + " (" +
                            preview(exc.what()) + ")");
    }
    check_finite(message);
    check_message(message, expect);
    return message;
}

void Session::send(const json& message, bool strict) {
    // Compact, keys sorted (nlohmann's object is a std::map). In a record, invalid UTF-8
    // throws rather than writing a line the harness would refuse; in an error message it is
    // replaced (U+FFFD), so an error can always be sent.
    const std::string text =
        message.dump(-1, ' ', false, strict ? json::error_handler_t::strict : json::error_handler_t::replace);
    std::fwrite(text.data(), 1, text.size(), out_);
    std::fputc('\n', out_);
    std::fflush(out_);
}

void Session::hello(const std::string& engine, const std::string& version,
                    const std::vector<std::string>& capabilities, const json& environment,
                    const std::optional<std::vector<std::string>>& features) {
    json message = {{"type", "hello"},   {"protocol", kProtocolVersion},   {"engine", engine},
                    {"version", version}, {"capabilities", capabilities}};
    if (!environment.is_null()) message["environment"] = environment;
    if (features) message["features"] = *features;
    send(message);
}

void Session::begin_run(const std::string& id) {
    run_id_ = id;
    seq_.clear();
    records_ = 0;
}

void Session::record(const std::string& layer, const json& data) {
    if (!data.is_object()) throw std::logic_error("a record's data must be a JSON object");
    std::int64_t& seq = seq_[layer];
    send({{"type", "record"}, {"id", run_id_}, {"layer", layer}, {"seq", seq}, {"data", data}});
    ++seq;
    ++records_;
}

void Session::done() { send({{"type", "done"}, {"id", run_id_}, {"records", records_}}); }

void Session::error(const std::optional<std::string>& id, ErrorKind kind, const std::string& message) {
    send({{"type", "error"},
          {"id", id ? json(*id) : json(nullptr)},
          {"kind", to_string(kind)},
          {"message", message}},
         /*strict=*/false);
}

}  // namespace parity
