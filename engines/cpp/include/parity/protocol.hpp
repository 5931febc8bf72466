// vllm-parity engine protocol, version 3, for C++ engines (see engines/PROTOCOL.md).
//
// JSON lines over stdin/stdout. This header gives a port everything the framing needs:
//   - LineReader: reads one '\n'-terminated line with a hard size limit (64 MiB), never more;
//   - decode(): strict UTF-8 (no BOM), no NaN/Infinity/overflowing numbers, no lone
//     surrogates, nesting at most 64 levels, then the message's required fields and types;
//   - Session: sends hello / record / done / error, numbers each layer's records (`seq`) and
//     counts them for `done`.
// JSON is nlohmann::json (Debian: nlohmann-json3-dev). Nothing here runs a shell.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace parity {

using json = nlohmann::json;

constexpr int kProtocolVersion = 3;
constexpr std::size_t kMaxLineBytes = 64u * 1024u * 1024u;  // one message, as PROTOCOL.md
constexpr int kMaxDepth = 64;  // the message object itself is depth 1

// The layers a run may ask for (protocol.LAYERS in conformance/formats/protocol.py).
extern const std::vector<std::string> kLayers;

// A line broke the protocol; what() says what was expected and what arrived.
struct ProtocolError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The three error kinds of an `error` message.
enum class ErrorKind { unsupported, bad_request, internal };
const char* to_string(ErrorKind kind);

// A run the engine answers with an error (kind + message) instead of records. Throw it from
// inside a run handler; the Session turns it into the `error` message with the run's id.
struct RunError : std::runtime_error {
    RunError(ErrorKind k, const std::string& message) : std::runtime_error(message), kind(k) {}
    ErrorKind kind;
};

// Reads '\n'-terminated lines from a FILE*, at most kMaxLineBytes each (the newline not
// counted). A longer line is consumed to its end and reported as too long: memory stays
// bounded whatever arrives.
class LineReader {
  public:
    explicit LineReader(std::FILE* in, std::size_t limit = kMaxLineBytes) : in_(in), limit_(limit) {}
    enum class Status { line, too_long, eof };
    // The next line into `line` (without its '\n'). A last line without '\n' still counts.
    Status next(std::string& line, std::size_t& length);

  private:
    std::FILE* in_;
    std::size_t limit_;
};

// Parses one line into a message of one of the `expect`ed types (empty: any known type).
// Throws ProtocolError naming what was expected and what arrived.
json decode(const std::string& line, const std::vector<std::string>& expect = {});

// Checks a message's `type` and required fields (both directions). Throws ProtocolError.
void check_message(const json& message, const std::vector<std::string>& expect = {});

// The engine's side of one session: writes protocol lines to `out` (stdout), flushing each.
class Session {
  public:
    explicit Session(std::FILE* out = stdout) : out_(out) {}

    // First line: hello. `environment` is optional provenance (an object, or null).
    // `features`: the features the engine has (engines/PROTOCOL.md "Features"; names from
    // conformance/formats/features.py). Left out (nullopt): every feature. A scenario needing
    // one not listed is not sent to the engine; its verdict is `unsupported`.
    void hello(const std::string& engine, const std::string& version,
               const std::vector<std::string>& capabilities, const json& environment = nullptr,
               const std::optional<std::vector<std::string>>& features = std::nullopt);

    // Starts answering run `id`: resets the per-layer seq counters and the record count.
    void begin_run(const std::string& id);
    // One record of `layer` for the current run; seq is numbered here (0, 1, 2 ... per layer).
    void record(const std::string& layer, const json& data);
    // Ends the current run with `done` (the count of records sent).
    void done();
    // Ends the current run (or, with id == nullopt, answers an unparsable line) with `error`.
    void error(const std::optional<std::string>& id, ErrorKind kind, const std::string& message);

    std::size_t records_sent() const { return records_; }

  private:
    void send(const json& message, bool strict = true);
    std::FILE* out_;
    std::string run_id_;
    std::map<std::string, std::int64_t> seq_;
    std::size_t records_ = 0;
};

// Serves runs until `shutdown` or end of input. `handler` is called for each well-formed
// `run` message (between begin_run and done); it sends records through the session and may
// throw RunError (-> `error` with that kind) or any std::exception (-> `error` kind internal).
// A line that cannot be parsed is answered with an `error` whose id is null, kind
// bad_request; the loop keeps serving. Returns the process exit status (0).
template <typename Handler>
int serve(Session& session, std::FILE* in, Handler&& handler);

}  // namespace parity

// ---- template implementation --------------------------------------------------------------
namespace parity {

template <typename Handler>
int serve(Session& session, std::FILE* in, Handler&& handler) {
    LineReader reader(in);
    std::string line;
    std::size_t length = 0;
    for (;;) {
        auto status = reader.next(line, length);
        if (status == LineReader::Status::eof) return 0;
        if (status == LineReader::Status::too_long) {
            session.error(std::nullopt, ErrorKind::bad_request,
                          "expected a line of at most " + std::to_string(kMaxLineBytes) +
                              " bytes, got " + std::to_string(length));
            continue;
        }
        json message;
        try {
            message = decode(line, {"run", "shutdown"});
        } catch (const ProtocolError& exc) {
            session.error(std::nullopt, ErrorKind::bad_request, exc.what());
            continue;
        }
        if (message["type"] == "shutdown") return 0;
        const std::string id = message["id"].get<std::string>();
        session.begin_run(id);
        try {
            handler(session, message);
            session.done();
        } catch (const RunError& exc) {
            session.error(id, exc.kind, exc.what());
        } catch (const std::exception& exc) {
            session.error(id, ErrorKind::internal, exc.what());
        }
    }
}

}  // namespace parity
