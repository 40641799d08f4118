// kvtier.hpp: header-only C++17 RAII wrapper over the kvtier C ABI (kvtier.h).
//
//   kvtier::Tier tier(R"({"store":{"type":"local","path":"/var/cache/kv"}})");
//   tier.register_memory(pool, num_blocks, block_bytes);
//   tier.submit_store(job_id, block_ids, keys, KVT_DEFAULT_KEY_BYTES);
//   for (const kvtier::Result& r : tier.poll()) { ... }
//
// Where the functions come from. Every call goes through a kvtier::Api, a table of
// function pointers:
//   * kvtier::Api::linked()     the symbols the program was linked against (-lkvtier);
//                               the default of every constructor that takes no Api;
//   * kvtier::Api::load(path)   dlopen(path, RTLD_NOW | RTLD_LOCAL) + dlsym of every
//                               kvt_ symbol; the program need not link libkvtier at all.
// Define KVTIER_HPP_NO_LINKED_API before including this header in a program that must not
// reference the kvt_ symbols directly (then every Tier takes an explicit Api), and
// KVTIER_HPP_NO_DLOPEN where <dlfcn.h> is unavailable.
//
// Errors. Failures throw kvtier::Error, which carries the kvt_status and the library's
// kvt_last_error() message. Every submit that throws still produces its one result from
// poll() (the C ABI's guarantee), except for Error::status() == KVT_STATUS_DUPLICATE_JOB,
// and except when the wrapper rejects the arguments itself before calling the library
// (key buffer size != block_ids.size() * key_len; Error::submitted() is false then).
// The try_submit_* variants return the status instead of throwing.
//
// Threading follows kvtier.h: submit_*, event_fd, jobs_in_flight and drain may run
// concurrently with each other and with poll; poll must not run concurrently with itself;
// shutdown, destruction and move-assignment must not run concurrently with anything on
// the same Tier.
//
// The wrapper needs C++17 with exceptions enabled.
//
// The library must never be dlclose()d (it runs I/O threads; it is linked -z nodelete),
// so an Api never closes its handle: it is a plain copyable table, and a Tier keeps its
// own copy of the Api it was given.
#ifndef KVTIER_HPP
#define KVTIER_HPP

#include "kvtier.h"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef KVTIER_HPP_NO_DLOPEN
#include <dlfcn.h>
#endif

namespace kvtier {

// A failed call: its status and the library's message.
class Error : public std::runtime_error {
public:
    Error(kvt_status status, const std::string &message, bool submitted = true)
        : std::runtime_error(message), status_(status), submitted_(submitted)
    {
    }
    kvt_status status() const noexcept { return status_; }
    // For submit errors: false only when the wrapper refused the arguments before
    // calling the library (no result will come from poll for that job).
    bool submitted() const noexcept { return submitted_; }

private:
    kvt_status status_;
    bool submitted_;
};

// A non-owning view of contiguous elements: built from a std::vector, a std::array, a
// C array, or a pointer and a count.
template <typename T>
class Span {
public:
    constexpr Span() noexcept = default;
    constexpr Span(const T *data, std::size_t size) noexcept : data_(data), size_(size) {}
    template <std::size_t N>
    constexpr Span(const T (&array)[N]) noexcept : data_(array), size_(N)
    {
    }
    template <typename C, typename = std::enable_if_t<std::is_convertible<
                              decltype(std::declval<const C &>().data()), const T *>::value>,
              typename = decltype(std::declval<const C &>().size())>
    constexpr Span(const C &container) noexcept : data_(container.data()), size_(container.size())
    {
    }
    constexpr const T *data() const noexcept { return data_; }
    constexpr std::size_t size() const noexcept { return size_; }
    constexpr bool empty() const noexcept { return size_ == 0; }
    constexpr const T *begin() const noexcept { return data_; }
    constexpr const T *end() const noexcept { return data_ + size_; }

private:
    const T *data_ = nullptr;
    std::size_t size_ = 0;
};

// The library's functions, from direct linking or from a dlopen'd handle.
struct Api {
    decltype(&::kvt_version) version = nullptr;
    decltype(&::kvt_status_str) status_str = nullptr;
    decltype(&::kvt_tier_new) tier_new = nullptr;
    decltype(&::kvt_tier_register_memory) tier_register_memory = nullptr;
    decltype(&::kvt_tier_submit_store) tier_submit_store = nullptr;
    decltype(&::kvt_tier_submit_load) tier_submit_load = nullptr;
    decltype(&::kvt_tier_poll) tier_poll = nullptr;
    decltype(&::kvt_tier_event_fd) tier_event_fd = nullptr;
    decltype(&::kvt_tier_jobs_in_flight) tier_jobs_in_flight = nullptr;
    decltype(&::kvt_tier_drain) tier_drain = nullptr;
    decltype(&::kvt_tier_shutdown) tier_shutdown = nullptr;
    decltype(&::kvt_tier_free) tier_free = nullptr;
    decltype(&::kvt_last_error) last_error = nullptr;
    // The dlopen handle (Api::load only; never closed). nullptr for linked().
    void *handle = nullptr;

    // True when every function pointer is set.
    bool complete() const noexcept
    {
        return version && status_str && tier_new && tier_register_memory && tier_submit_store &&
               tier_submit_load && tier_poll && tier_event_fd && tier_jobs_in_flight && tier_drain &&
               tier_shutdown && tier_free && last_error;
    }

#ifndef KVTIER_HPP_NO_LINKED_API
    // The functions the program is linked against.
    static const Api &linked() noexcept
    {
        static const Api api = [] {
            Api a;
            a.version = &::kvt_version;
            a.status_str = &::kvt_status_str;
            a.tier_new = &::kvt_tier_new;
            a.tier_register_memory = &::kvt_tier_register_memory;
            a.tier_submit_store = &::kvt_tier_submit_store;
            a.tier_submit_load = &::kvt_tier_submit_load;
            a.tier_poll = &::kvt_tier_poll;
            a.tier_event_fd = &::kvt_tier_event_fd;
            a.tier_jobs_in_flight = &::kvt_tier_jobs_in_flight;
            a.tier_drain = &::kvt_tier_drain;
            a.tier_shutdown = &::kvt_tier_shutdown;
            a.tier_free = &::kvt_tier_free;
            a.last_error = &::kvt_last_error;
            return a;
        }();
        return api;
    }
#endif

#ifndef KVTIER_HPP_NO_DLOPEN
    // dlopen(path, flags) and resolve every kvt_ symbol. Throws Error with status
    // KVT_STATUS_NOT_FOUND and dlerror()'s text when the library or a symbol is missing,
    // and KVT_STATUS_STATE when the library's version is not ABI-compatible with this
    // header (same major version; for 0.x, same minor). The handle is never closed.
    static Api load(const char *path, int flags = RTLD_NOW | RTLD_LOCAL)
    {
        if (path == nullptr) {
            throw Error(KVT_STATUS_NULL_ARGUMENT, "kvtier::Api::load: path is NULL");
        }
        dlerror();
        void *handle = ::dlopen(path, flags);
        if (handle == nullptr) {
            const char *why = dlerror();
            throw Error(KVT_STATUS_NOT_FOUND,
                        std::string("kvtier::Api::load: dlopen(") + path + "): " + (why ? why : "unknown error"));
        }
        return from_handle(handle);
    }

    // Resolve every kvt_ symbol from an existing dlopen handle (or RTLD_DEFAULT).
    static Api from_handle(void *handle)
    {
        Api a;
        a.handle = handle;
        resolve(handle, "kvt_version", a.version);
        resolve(handle, "kvt_status_str", a.status_str);
        resolve(handle, "kvt_tier_new", a.tier_new);
        resolve(handle, "kvt_tier_register_memory", a.tier_register_memory);
        resolve(handle, "kvt_tier_submit_store", a.tier_submit_store);
        resolve(handle, "kvt_tier_submit_load", a.tier_submit_load);
        resolve(handle, "kvt_tier_poll", a.tier_poll);
        resolve(handle, "kvt_tier_event_fd", a.tier_event_fd);
        resolve(handle, "kvt_tier_jobs_in_flight", a.tier_jobs_in_flight);
        resolve(handle, "kvt_tier_drain", a.tier_drain);
        resolve(handle, "kvt_tier_shutdown", a.tier_shutdown);
        resolve(handle, "kvt_tier_free", a.tier_free);
        resolve(handle, "kvt_last_error", a.last_error);
        a.check_version();
        return a;
    }
#endif

    // Throws Error(KVT_STATUS_STATE) unless the library is ABI-compatible with this
    // header: same major version, and for 0.x the same minor version too.
    void check_version() const
    {
        const char *v = version ? version() : nullptr;
        unsigned long major = 0, minor = 0;
        char *end = nullptr;
        bool parsed = false;
        if (v != nullptr) {
            major = std::strtoul(v, &end, 10);
            if (end != v && *end == '.') {
                const char *m = end + 1;
                minor = std::strtoul(m, &end, 10);
                parsed = end != m;
            }
        }
        const bool compatible = parsed && major == KVTIER_VERSION_MAJOR &&
                                (KVTIER_VERSION_MAJOR != 0 || minor == KVTIER_VERSION_MINOR);
        if (!compatible) {
            throw Error(KVT_STATUS_STATE, std::string("kvtier: library version ") + (v ? v : "(none)") +
                                              " is not ABI-compatible with kvtier.hpp built for " KVTIER_VERSION);
        }
    }

private:
#ifndef KVTIER_HPP_NO_DLOPEN
    template <typename Fn>
    static void resolve(void *handle, const char *name, Fn &out)
    {
        dlerror();
        void *sym = ::dlsym(handle, name);
        if (sym == nullptr) {
            const char *why = dlerror();
            throw Error(KVT_STATUS_NOT_FOUND, std::string("kvtier::Api: dlsym(") + name + "): " +
                                                  (why ? why : "symbol is NULL"));
        }
        // Object pointer to function pointer without a conditionally-supported cast.
        static_assert(sizeof(Fn) == sizeof(void *), "function pointers must be pointer-sized");
        std::memcpy(&out, &sym, sizeof out);
    }
#endif
};

// One finished job, copied out of the library's kvt_result (so it outlives the next poll).
struct Result {
    std::uint64_t job_id = 0;
    kvt_job_kind kind = KVT_JOB_KIND_STORE;
    // KVT_STATUS_OK only if every key succeeded; otherwise the first failing key's status.
    kvt_status status = KVT_STATUS_OK;
    // Bytes moved by the keys that succeeded.
    std::uint64_t bytes = 0;
    double seconds = 0.0;
    // Outcome of each key, in submission order.
    std::vector<kvt_status> key_status{};
    std::size_t num_failed_keys = 0;
    // Why the job failed ("" on success).
    std::string message{};

    bool ok() const noexcept { return status == KVT_STATUS_OK; }
};

// Throws Error for a non-OK status, with "<what>: <kvt_last_error()>" as message.
inline void check(const Api &api, kvt_status status, const char *what)
{
    if (status != KVT_STATUS_OK) {
        const char *message = api.last_error ? api.last_error() : nullptr;
        throw Error(status, std::string(what) + ": " +
                                (message && *message ? message : api.status_str(static_cast<int>(status))));
    }
}

// An owned kvt_tier. Move-only; the destructor calls kvt_tier_free (which shuts the tier
// down first: jobs not started are cancelled, running ones are waited for).
class Tier {
public:
#ifndef KVTIER_HPP_NO_LINKED_API
    explicit Tier(const std::string &config_json) : Tier(Api::linked(), config_json) {}
    explicit Tier(const char *config_json) : Tier(Api::linked(), config_json) {}
#endif
    Tier(const Api &api, const std::string &config_json) : Tier(api, config_json.c_str()) {}

    // kvt_tier_new; throws Error (KVT_STATUS_CONFIG for a bad configuration, naming the
    // offending key; KVT_STATUS_CONNECT etc. when the store's probe fails).
    Tier(const Api &api, const char *config_json) : api_(api), tier_(nullptr), scratch_()
    {
        if (!api_.complete()) {
            throw Error(KVT_STATUS_NULL_ARGUMENT, "kvtier::Tier: the Api has unresolved functions");
        }
        kvt_tier *tier = nullptr;
        check(api_, api_.tier_new(config_json, &tier), "kvt_tier_new");
        tier_ = tier;
    }

    ~Tier() { reset(); }

    Tier(const Tier &) = delete;
    Tier &operator=(const Tier &) = delete;

    Tier(Tier &&other) noexcept
        : api_(other.api_), tier_(std::exchange(other.tier_, nullptr)), scratch_(std::move(other.scratch_))
    {
    }
    Tier &operator=(Tier &&other) noexcept
    {
        if (this != &other) {
            reset();
            api_ = other.api_;
            tier_ = std::exchange(other.tier_, nullptr);
            scratch_ = std::move(other.scratch_);
        }
        return *this;
    }

    // Frees the tier now (kvt_tier_free); the object is empty afterwards.
    void reset() noexcept
    {
        if (tier_ != nullptr) {
            api_.tier_free(std::exchange(tier_, nullptr));
        }
    }

    // False after a move or reset().
    explicit operator bool() const noexcept { return tier_ != nullptr; }
    kvt_tier *native_handle() const noexcept { return tier_; }
    const Api &api() const noexcept { return api_; }

    // kvt_tier_register_memory. The pool must outlive the tier (or shutdown()).
    void register_memory(void *base, std::uint64_t num_blocks, std::size_t block_bytes)
    {
        check(api_, api_.tier_register_memory(tier_, static_cast<std::uint8_t *>(base), num_blocks, block_bytes),
              "kvt_tier_register_memory");
    }

    // Store block block_ids[i] under key i. `keys` holds block_ids.size() keys of key_len
    // bytes back to back. Throws Error; see the top of this file for which errors still
    // produce a result.
    void submit_store(std::uint64_t job_id, Span<std::uint64_t> block_ids, Span<std::uint8_t> keys,
                      std::size_t key_len = KVT_DEFAULT_KEY_BYTES)
    {
        submit(KVT_JOB_KIND_STORE, job_id, block_ids, keys, key_len, true);
    }

    // Load key i into block block_ids[i]. Same arguments and errors as submit_store.
    void submit_load(std::uint64_t job_id, Span<std::uint64_t> block_ids, Span<std::uint8_t> keys,
                     std::size_t key_len = KVT_DEFAULT_KEY_BYTES)
    {
        submit(KVT_JOB_KIND_LOAD, job_id, block_ids, keys, key_len, true);
    }

    // Non-throwing variants: the status of the submission (the message is last_error()).
    // A wrapper-side argument error returns KVT_STATUS_INVALID_ARGUMENT without a result.
    kvt_status try_submit_store(std::uint64_t job_id, Span<std::uint64_t> block_ids, Span<std::uint8_t> keys,
                                std::size_t key_len = KVT_DEFAULT_KEY_BYTES) noexcept
    {
        return submit(KVT_JOB_KIND_STORE, job_id, block_ids, keys, key_len, false);
    }
    kvt_status try_submit_load(std::uint64_t job_id, Span<std::uint64_t> block_ids, Span<std::uint8_t> keys,
                               std::size_t key_len = KVT_DEFAULT_KEY_BYTES) noexcept
    {
        return submit(KVT_JOB_KIND_LOAD, job_id, block_ids, keys, key_len, false);
    }

    // Takes up to max_results finished jobs (never blocks). Throws Error.
    std::vector<Result> poll(std::size_t max_results = 64)
    {
        std::vector<Result> out;
        poll_into(out, max_results);
        return out;
    }

    // Appends up to max_results finished jobs to `out`; returns how many.
    std::size_t poll_into(std::vector<Result> &out, std::size_t max_results = 64)
    {
        if (scratch_.size() < max_results) {
            scratch_.resize(max_results);
        }
        std::size_t n = 0;
        check(api_, api_.tier_poll(tier_, scratch_.data(), max_results, &n), "kvt_tier_poll");
        out.reserve(out.size() + n);
        for (std::size_t i = 0; i < n; ++i) {
            const kvt_result &r = scratch_[i];
            Result c;
            c.job_id = r.job_id;
            c.kind = r.kind;
            c.status = r.status;
            c.bytes = r.bytes;
            c.seconds = r.seconds;
            if (r.num_keys > 0 && r.key_status != nullptr) {
                c.key_status.assign(r.key_status, r.key_status + r.num_keys);
            }
            c.num_failed_keys = r.num_failed_keys;
            c.message = r.message ? r.message : "";
            out.push_back(std::move(c));
        }
        return n;
    }

    // Readable while results wait (poll(2)/epoll). Owned by the tier: do not close it.
    int event_fd() const noexcept { return api_.tier_event_fd(tier_); }

    std::size_t jobs_in_flight() const noexcept { return api_.tier_jobs_in_flight(tier_); }

    // Waits until nothing is in flight: true when drained, false on timeout. Results stay
    // queued for poll(). Throws Error for other failures (e.g. after shutdown).
    bool drain(std::chrono::milliseconds timeout)
    {
        const auto ms = timeout.count() < 0 ? 0 : timeout.count();
        const kvt_status s = api_.tier_drain(tier_, static_cast<std::uint64_t>(ms));
        if (s == KVT_STATUS_TIMEOUT) {
            return false;
        }
        check(api_, s, "kvt_tier_drain");
        return true;
    }

    // kvt_tier_shutdown: cancels what has not started, waits for the rest; results stay
    // available to poll(). Idempotent. Throws Error.
    void shutdown() { check(api_, api_.tier_shutdown(tier_), "kvt_tier_shutdown"); }

    // The message of the last failed kvt_ call on this thread.
    std::string last_error() const { return api_.last_error(); }

private:
    kvt_status submit(kvt_job_kind kind, std::uint64_t job_id, Span<std::uint64_t> block_ids,
                      Span<std::uint8_t> keys, std::size_t key_len, bool throw_on_error)
    {
        const std::size_t n = block_ids.size();
        if (key_len == 0 || keys.size() != n * key_len || (n != 0 && keys.size() / n != key_len)) {
            if (throw_on_error) {
                throw Error(KVT_STATUS_INVALID_ARGUMENT,
                            "kvtier::Tier::submit: the key buffer holds " + std::to_string(keys.size()) +
                                " bytes, not " + std::to_string(n) + " keys of " + std::to_string(key_len) +
                                " bytes; nothing was submitted",
                            false);
            }
            return KVT_STATUS_INVALID_ARGUMENT;
        }
        const kvt_status s =
            kind == KVT_JOB_KIND_STORE
                ? api_.tier_submit_store(tier_, job_id, block_ids.data(), keys.data(), key_len, n)
                : api_.tier_submit_load(tier_, job_id, block_ids.data(), keys.data(), key_len, n);
        if (throw_on_error) {
            check(api_, s, kind == KVT_JOB_KIND_STORE ? "kvt_tier_submit_store" : "kvt_tier_submit_load");
        }
        return s;
    }

    Api api_;
    kvt_tier *tier_ = nullptr;
    std::vector<kvt_result> scratch_;
};

// The library's version string ("0.1.0").
inline std::string version(const Api &api) { return api.version(); }
#ifndef KVTIER_HPP_NO_LINKED_API
inline std::string version() { return version(Api::linked()); }
#endif

} // namespace kvtier

#endif // KVTIER_HPP
