// kvtier.hpp: header-only C++17 RAII wrapper over the kvtier C ABI (kvtier.h). One file
// because a header-only library is one include: it wraps every export of kvtier.h.
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
// the same Tier. lookup, schedule_end, request_finished, check_now, stats, metrics, location,
// evict_now and clear are thread-safe; take_events/take_kv_events must not run concurrently with
// themselves (each call releases the previous call's key buffers; the wrapper copies them).
// Signals follow kvtier.h too: a host need not ignore SIGPIPE.
//
// Ownership and lifetime. A Tier owns its kvt_tier and frees it exactly once (destructor
// or reset()). Spans passed in are borrowed for the call only; the registered pool stays
// the caller's and must outlive the Tier (or shutdown()). Everything returned (Result,
// Event, strings) is a copy that outlives the next call.
//
// After shutdown(): poll, take_events, take_kv_events, stats, metrics, event_fd,
// jobs_in_flight, location, remove_region, shutdown and destruction work as before; submits throw
// KVT_STATUS_SHUT_DOWN (and still yield their result); register_memory, add_region, drain, lookup,
// schedule_end, request_finished, check_now, evict_now, clear and delete_keys throw KVT_STATUS_SHUT_DOWN. After an Error with
// KVT_STATUS_PANIC the tier refuses further work: shut it down and destroy it.
//
// After fork(): a Tier belongs to the process that created it. In a child every call on
// a parent's Tier throws KVT_STATUS_FORKED (event_fd returns -1, jobs_in_flight 0,
// location throws KVT_STATUS_STATE); destroying it retires the handle without joining
// threads. The child may create Tiers of its own. config_check, vllm_namespace,
// config_schema and stats_fields need no tier and work anywhere.
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
#include <functional>
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
    decltype(&::kvt_config_schema) config_schema = nullptr;
    decltype(&::kvt_stats_fields) stats_fields = nullptr;
    decltype(&::kvt_config_check) config_check = nullptr;
    decltype(&::kvt_tier_location) tier_location = nullptr;
    decltype(&::kvt_tier_lookup) tier_lookup = nullptr;
    decltype(&::kvt_tier_lookup_batch) tier_lookup_batch = nullptr;
    decltype(&::kvt_tier_schedule_end) tier_schedule_end = nullptr;
    decltype(&::kvt_tier_request_finished) tier_request_finished = nullptr;
    decltype(&::kvt_tier_check_now) tier_check_now = nullptr;
    decltype(&::kvt_tier_take_events) tier_take_events = nullptr;
    decltype(&::kvt_tier_take_kv_events) tier_take_kv_events = nullptr;
    decltype(&::kvt_tier_evict_now) tier_evict_now = nullptr;
    decltype(&::kvt_tier_clear) tier_clear = nullptr;
    decltype(&::kvt_tier_delete) tier_delete = nullptr;
    decltype(&::kvt_tier_pin) tier_pin = nullptr;
    decltype(&::kvt_tier_unpin) tier_unpin = nullptr;
    decltype(&::kvt_tier_stats) tier_stats = nullptr;
    decltype(&::kvt_tier_metrics) tier_metrics = nullptr;
    decltype(&::kvt_set_log_callback) set_log_callback = nullptr;
    decltype(&::kvt_vllm_namespace) vllm_namespace = nullptr;
    decltype(&::kvt_tier_add_region) tier_add_region = nullptr;
    decltype(&::kvt_tier_remove_region) tier_remove_region = nullptr;
    decltype(&::kvt_tier_submit_store_ranges) tier_submit_store_ranges = nullptr;
    decltype(&::kvt_tier_submit_load_ranges) tier_submit_load_ranges = nullptr;
    // The dlopen handle (Api::load only; never closed). nullptr for linked().
    void *handle = nullptr;

    // True when every function pointer is set.
    bool complete() const noexcept
    {
        return version && status_str && tier_new && tier_register_memory && tier_submit_store &&
               tier_submit_load && tier_poll && tier_event_fd && tier_jobs_in_flight && tier_drain &&
               tier_shutdown && tier_free && last_error && config_schema && stats_fields && config_check &&
               tier_location && tier_lookup && tier_lookup_batch && tier_schedule_end && tier_request_finished && tier_check_now && tier_take_events &&
               tier_take_kv_events && tier_evict_now && tier_clear && tier_delete && tier_pin && tier_unpin && tier_stats && tier_metrics && set_log_callback &&
               vllm_namespace && tier_add_region && tier_remove_region && tier_submit_store_ranges &&
               tier_submit_load_ranges;
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
            a.config_schema = &::kvt_config_schema;
            a.stats_fields = &::kvt_stats_fields;
            a.config_check = &::kvt_config_check;
            a.tier_location = &::kvt_tier_location;
            a.tier_lookup = &::kvt_tier_lookup;
            a.tier_lookup_batch = &::kvt_tier_lookup_batch;
            a.tier_schedule_end = &::kvt_tier_schedule_end;
            a.tier_request_finished = &::kvt_tier_request_finished;
            a.tier_check_now = &::kvt_tier_check_now;
            a.tier_take_events = &::kvt_tier_take_events;
            a.tier_take_kv_events = &::kvt_tier_take_kv_events;
            a.tier_evict_now = &::kvt_tier_evict_now;
            a.tier_clear = &::kvt_tier_clear;
            a.tier_delete = &::kvt_tier_delete;
            a.tier_pin = &::kvt_tier_pin;
            a.tier_unpin = &::kvt_tier_unpin;
            a.tier_stats = &::kvt_tier_stats;
            a.tier_metrics = &::kvt_tier_metrics;
            a.set_log_callback = &::kvt_set_log_callback;
            a.vllm_namespace = &::kvt_vllm_namespace;
            a.tier_add_region = &::kvt_tier_add_region;
            a.tier_remove_region = &::kvt_tier_remove_region;
            a.tier_submit_store_ranges = &::kvt_tier_submit_store_ranges;
            a.tier_submit_load_ranges = &::kvt_tier_submit_load_ranges;
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
        resolve(handle, "kvt_config_schema", a.config_schema);
        resolve(handle, "kvt_stats_fields", a.stats_fields);
        resolve(handle, "kvt_config_check", a.config_check);
        resolve(handle, "kvt_tier_location", a.tier_location);
        resolve(handle, "kvt_tier_lookup", a.tier_lookup);
        resolve(handle, "kvt_tier_lookup_batch", a.tier_lookup_batch);
        resolve(handle, "kvt_tier_schedule_end", a.tier_schedule_end);
        resolve(handle, "kvt_tier_request_finished", a.tier_request_finished);
        resolve(handle, "kvt_tier_check_now", a.tier_check_now);
        resolve(handle, "kvt_tier_take_events", a.tier_take_events);
        resolve(handle, "kvt_tier_take_kv_events", a.tier_take_kv_events);
        resolve(handle, "kvt_tier_evict_now", a.tier_evict_now);
        resolve(handle, "kvt_tier_clear", a.tier_clear);
        resolve(handle, "kvt_tier_delete", a.tier_delete);
        resolve(handle, "kvt_tier_pin", a.tier_pin);
        resolve(handle, "kvt_tier_unpin", a.tier_unpin);
        resolve(handle, "kvt_tier_stats", a.tier_stats);
        resolve(handle, "kvt_tier_metrics", a.tier_metrics);
        resolve(handle, "kvt_set_log_callback", a.set_log_callback);
        resolve(handle, "kvt_vllm_namespace", a.vllm_namespace);
        resolve(handle, "kvt_tier_add_region", a.tier_add_region);
        resolve(handle, "kvt_tier_remove_region", a.tier_remove_region);
        resolve(handle, "kvt_tier_submit_store_ranges", a.tier_submit_store_ranges);
        resolve(handle, "kvt_tier_submit_load_ranges", a.tier_submit_load_ranges);
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

// One KV event, copied out of the library's kvt_event / kvt_kv_event: the key buffers the
// library hands out are owned by the tier and valid only until the next take_events /
// take_kv_events (or kvt_tier_free), so the wrapper copies them before returning.
struct Event {
    // The store job that stored the keys; 0 for a removal.
    std::uint64_t job_id = 0;
    // Bytes of each key; `keys` holds num_keys() keys of key_len bytes back to back.
    std::size_t key_len = 0;
    std::vector<std::uint8_t> keys{};
    // Always "STORAGE" (vLLM's Medium.STORAGE).
    std::string medium{};
    kvt_locality locality = KVT_LOCALITY_UNSET;
    // BlockRemoved (eviction, or a corrupt object deleted) rather than BlockStored. Always
    // false from take_events(), which only returns BlockStored events.
    bool removed = false;

    std::size_t num_keys() const noexcept { return key_len == 0 ? 0 : keys.size() / key_len; }
    // Key i (i < num_keys()), a view into `keys`.
    Span<std::uint8_t> key(std::size_t i) const noexcept
    {
        return Span<std::uint8_t>(keys.data() + i * key_len, key_len);
    }
};

// A part of a key's object in caller memory: len bytes at offset in region `region` (an
// id from Tier::add_region). kvt_range.
using Range = kvt_range;

// A snapshot of the tier's counters (kvt_stats; see kvt_stats_fields() for names/help).
using Stats = kvt_stats;
// What one eviction round found and did (kvt_eviction_report).
using EvictionReport = kvt_eviction_report;

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
// down first: jobs not started are cancelled, running ones are waited for up to the
// configuration's shutdown_timeout_ms, then abandoned; it returns within that plus about
// 1 s, even while a read hangs, and the pool is no longer touched once it has).
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

    // ---- Regions and range jobs (kvt_tier_add_region / _remove_region /
    // _submit_store_ranges / _submit_load_ranges).

    // Registers `len` bytes at `base` as a region that range jobs name parts of; returns
    // its id (never 0, never reused by this tier). The memory stays the caller's and must
    // stay valid until remove_region(id) returns, or until the Tier is destroyed (or
    // shutdown() returns). Regions may overlap each other and the pool. Thread-safe.
    // Throws Error (KVT_STATUS_INVALID_ARGUMENT for len 0, KVT_STATUS_SHUT_DOWN after
    // shutdown(), KVT_STATUS_FORKED in a fork() child).
    std::uint64_t add_region(void *base, std::size_t len)
    {
        std::uint64_t region = 0;
        check(api_, api_.tier_add_region(tier_, static_cast<std::uint8_t *>(base), len, &region),
              "kvt_tier_add_region");
        return region;
    }

    // Forgets a region; afterwards the library never touches its memory. Throws Error:
    // KVT_STATUS_BLOCK_BUSY while a job whose result poll() has not returned holds a range
    // of it (the region stays registered: poll first, then retry); KVT_STATUS_INVALID_ARGUMENT
    // for an id not registered. Works after shutdown(). Thread-safe.
    void remove_region(std::uint64_t region)
    {
        check(api_, api_.tier_remove_region(tier_, region), "kvt_tier_remove_region");
    }

    // Stores, under key i, the object made of ranges[i * ranges_per_key ..
    // (i + 1) * ranges_per_key] one after the other (the same object a pool block with the
    // same bytes gives). `keys` holds keys.size() / key_len keys; `ranges` must hold
    // exactly num_keys * ranges_per_key ranges (else the wrapper throws
    // KVT_STATUS_INVALID_ARGUMENT with submitted() false, and no result comes). Both are
    // borrowed for the call only; the ranges' bytes are read asynchronously and must not be
    // modified until poll() returned the job's result. Errors and results as submit_store.
    void submit_store_ranges(std::uint64_t job_id, Span<Range> ranges, std::size_t ranges_per_key,
                             Span<std::uint8_t> keys, std::size_t key_len = KVT_DEFAULT_KEY_BYTES)
    {
        submit_ranges(KVT_JOB_KIND_STORE, job_id, ranges, ranges_per_key, keys, key_len, true);
    }

    // Loads key i into its ranges (straight from the store). The ranges are written
    // asynchronously: do not read or write them until poll() returned the job's result.
    // A load needs its bytes alone (KVT_STATUS_BLOCK_BUSY otherwise); overlapping ranges
    // in one load are KVT_STATUS_INVALID_ARGUMENT. Same arguments as submit_store_ranges.
    void submit_load_ranges(std::uint64_t job_id, Span<Range> ranges, std::size_t ranges_per_key,
                            Span<std::uint8_t> keys, std::size_t key_len = KVT_DEFAULT_KEY_BYTES)
    {
        submit_ranges(KVT_JOB_KIND_LOAD, job_id, ranges, ranges_per_key, keys, key_len, true);
    }

    // Non-throwing variants: the status of the submission.
    kvt_status try_submit_store_ranges(std::uint64_t job_id, Span<Range> ranges, std::size_t ranges_per_key,
                                       Span<std::uint8_t> keys, std::size_t key_len = KVT_DEFAULT_KEY_BYTES) noexcept
    {
        return submit_ranges(KVT_JOB_KIND_STORE, job_id, ranges, ranges_per_key, keys, key_len, false);
    }
    kvt_status try_submit_load_ranges(std::uint64_t job_id, Span<Range> ranges, std::size_t ranges_per_key,
                                      Span<std::uint8_t> keys, std::size_t key_len = KVT_DEFAULT_KEY_BYTES) noexcept
    {
        return submit_ranges(KVT_JOB_KIND_LOAD, job_id, ranges, ranges_per_key, keys, key_len, false);
    }

    // ---- Lookups (kvt_tier_lookup / kvt_tier_schedule_end / kvt_tier_request_finished).
    // Never block and never do I/O on the caller's thread; thread-safe (may run
    // concurrently with anything but shutdown/destruction). After shutdown() they throw
    // Error(KVT_STATUS_SHUT_DOWN); in a fork() child Error(KVT_STATUS_FORKED).

    // Whether the tier holds `key` (key_len = key.size(), borrowed for the call) for
    // request `req_id`: KVT_LOOKUP_RESULT_HIT, _MISS, or _RETRY when not known yet (an
    // unknown key is checked after the next schedule_end(); ask again in a later step).
    // Verdicts are kept until the last request holding them calls request_finished().
    // Throws Error (KVT_STATUS_INVALID_ARGUMENT for a wrong key length).
    kvt_lookup_result lookup(std::uint64_t req_id, Span<std::uint8_t> key)
    {
        kvt_lookup_result r = KVT_LOOKUP_RESULT_MISS;
        check(api_, api_.tier_lookup(tier_, req_id, key.data(), key.size(), &r), "kvt_tier_lookup");
        return r;
    }

    // Answers keys.size() / key_len lookups at once (kvt_tier_lookup_batch), as lookup()
    // for each in turn: key i for request req_ids[i]. Throws Error
    // (KVT_STATUS_INVALID_ARGUMENT when `keys` is not req_ids.size() keys of key_len bytes).
    std::vector<kvt_lookup_result> lookup_batch(Span<std::uint64_t> req_ids, Span<std::uint8_t> keys,
                                                std::size_t key_len = KVT_DEFAULT_KEY_BYTES)
    {
        const std::size_t n = whole_keys("kvt_tier_lookup_batch", keys, key_len);
        if (n != req_ids.size()) {
            throw Error(KVT_STATUS_INVALID_ARGUMENT,
                        "kvt_tier_lookup_batch: " + std::to_string(req_ids.size()) + " request ids for " +
                            std::to_string(n) + " keys",
                        false);
        }
        std::vector<kvt_lookup_result> r(n, KVT_LOOKUP_RESULT_MISS);
        check(api_, api_.tier_lookup_batch(tier_, req_ids.data(), keys.data(), key_len, n, r.data()),
              "kvt_tier_lookup_batch");
        return r;
    }

    // Ends a scheduler step: the lookups asked since the last call are checked, as one
    // batch, on the lookup lane. Throws Error.
    void schedule_end() { check(api_, api_.tier_schedule_end(tier_), "kvt_tier_schedule_end"); }

    // Request `req_id` will not look anything up again; its verdicts are dropped. Unknown
    // ids are ignored. Throws Error.
    void request_finished(std::uint64_t req_id)
    {
        check(api_, api_.tier_request_finished(tier_, req_id), "kvt_tier_request_finished");
    }

    // Checks keys.size() / key_len keys (back to back in `keys`, borrowed for the call) in
    // the store now, blocking until all have answered or `timeout` has passed: one
    // verdict per key, HIT or MISS as the store answered, RETRY where a check failed or
    // was late (kvt_tier_check_now). For engines whose existence call is synchronous.
    // Thread-safe. Throws Error (KVT_STATUS_INVALID_ARGUMENT for a key buffer that is not
    // a whole number of keys, or a wrong key length; KVT_STATUS_SHUT_DOWN after shutdown).
    std::vector<kvt_lookup_result> check_now(Span<std::uint8_t> keys, std::size_t key_len = KVT_DEFAULT_KEY_BYTES,
                                             std::chrono::milliseconds timeout = std::chrono::seconds(10))
    {
        if (key_len == 0 || keys.size() % key_len != 0) {
            throw Error(KVT_STATUS_INVALID_ARGUMENT,
                        "kvt_tier_check_now: the key buffer is not a whole number of key_len-byte keys", false);
        }
        std::vector<kvt_lookup_result> out(keys.size() / key_len, KVT_LOOKUP_RESULT_RETRY);
        auto ms = timeout.count() < 0 ? 0 : static_cast<std::uint64_t>(timeout.count());
        check(api_, api_.tier_check_now(tier_, keys.data(), key_len, out.size(), ms, out.data()),
              "kvt_tier_check_now");
        return out;
    }

    // ---- Events (needs `enable_kv_events` in the configuration).
    // take_events / take_kv_events must not run concurrently with themselves or each other
    // on one Tier (the library frees the previous call's key buffers on the next call;
    // the returned Events are copies and stay valid). They work after shutdown(). Use one
    // of the two on a tier, not both: take_events drops the BlockRemoved events it meets.

    // Up to max_events BlockStored events (one per successful store job whose result
    // poll() returned), oldest first; the rest wait for the next call. Throws Error.
    std::vector<Event> take_events(std::size_t max_events = 64)
    {
        std::vector<kvt_event> raw(max_events);
        std::size_t n = 0;
        check(api_, api_.tier_take_events(tier_, raw.data(), max_events, &n), "kvt_tier_take_events");
        std::vector<Event> out;
        out.reserve(n);
        for (std::size_t i = 0; i < n; ++i) {
            out.push_back(copy_event(raw[i], false));
        }
        return out;
    }

    // Up to max_events KV events, BlockStored and BlockRemoved (removed == true, job_id 0:
    // eviction, or corrupt objects deleted under on_corrupt = fail_and_delete), oldest
    // first. Throws Error.
    std::vector<Event> take_kv_events(std::size_t max_events = 64)
    {
        std::vector<kvt_kv_event> raw(max_events);
        std::size_t n = 0;
        check(api_, api_.tier_take_kv_events(tier_, raw.data(), max_events, &n), "kvt_tier_take_kv_events");
        std::vector<Event> out;
        out.reserve(n);
        for (std::size_t i = 0; i < n; ++i) {
            out.push_back(copy_event(raw[i].event, raw[i].removed));
        }
        return out;
    }

    // ---- Eviction. One round now (kvt_tier_evict_now): lists the namespace, deletes the
    // oldest blocks past eviction.max_bytes and those older than eviction.max_age_s; each
    // deleted block yields a BlockRemoved event. Blocks for the listing and deletes.
    // Thread-safe. Throws Error (KVT_STATUS_STATE when the configuration has no eviction).
    EvictionReport evict_now()
    {
        EvictionReport r{};
        check(api_, api_.tier_evict_now(tier_, &r), "kvt_tier_evict_now");
        return r;
    }

    // Deletes every block of the tier's namespace (kvt_tier_clear), whether or not
    // eviction is configured; each deleted block yields a BlockRemoved event. Blocks for
    // the listing and deletes. Thread-safe. Throws Error.
    EvictionReport clear()
    {
        EvictionReport r{};
        check(api_, api_.tier_clear(tier_, &r), "kvt_tier_clear");
        return r;
    }

    // Deletes the blocks of keys.size() / key_len keys (back to back in `keys`, borrowed
    // for the call) and waits (kvt_tier_delete): each block gone afterwards, deleted or
    // absent already, yields a BlockRemoved event; the report counts the blocks asked
    // (objects) and gone (deleted), its bytes 0. Thread-safe. Throws Error
    // (KVT_STATUS_INVALID_ARGUMENT for a key buffer that is not a whole number of keys, or
    // a wrong key length; KVT_STATUS_SHUT_DOWN after shutdown).
    EvictionReport delete_keys(Span<std::uint8_t> keys, std::size_t key_len = KVT_DEFAULT_KEY_BYTES)
    {
        const std::size_t n = whole_keys("kvt_tier_delete", keys, key_len);
        EvictionReport r{};
        check(api_, api_.tier_delete(tier_, keys.data(), key_len, n, &r), "kvt_tier_delete");
        return r;
    }

    // Pins the blocks of keys.size() / key_len keys (kvt_tier_pin): this tier's own
    // eviction keeps them until unpin() (pins count). Returns for each key whether the pin
    // holds it (false: this tier's eviction was deleting it at that moment). Holds against
    // this tier alone; see the C header. Does not block. Thread-safe. Throws Error as
    // delete_keys does.
    std::vector<bool> pin(Span<std::uint8_t> keys, std::size_t key_len = KVT_DEFAULT_KEY_BYTES)
    {
        const std::size_t n = whole_keys("kvt_tier_pin", keys, key_len);
        std::vector<std::uint8_t> held(n, 0);
        check(api_, api_.tier_pin(tier_, keys.data(), key_len, n, held.data()), "kvt_tier_pin");
        return std::vector<bool>(held.begin(), held.end());
    }

    // Takes one pin from each key (kvt_tier_unpin); a key not pinned is left alone.
    // Thread-safe. Throws Error as delete_keys does.
    void unpin(Span<std::uint8_t> keys, std::size_t key_len = KVT_DEFAULT_KEY_BYTES)
    {
        const std::size_t n = whole_keys("kvt_tier_unpin", keys, key_len);
        check(api_, api_.tier_unpin(tier_, keys.data(), key_len, n), "kvt_tier_unpin");
    }

    // ---- Counters. A copy of the tier's counters (kvt_tier_stats with sizeof(kvt_stats)).
    // Thread-safe; works after shutdown(). Throws Error.
    Stats stats() const
    {
        Stats s{};
        check(api_, api_.tier_stats(tier_, &s, sizeof s), "kvt_tier_stats");
        return s;
    }

    // The tier's metrics in the Prometheus text format 0.0.4 (kvt_tier_metrics):
    // kvtier_<counter>_total for every counter, gauges and histograms. Grows its buffer
    // and retries when the text grew between the size query and the copy. Thread-safe;
    // works after shutdown(). Throws Error.
    std::string metrics() const
    {
        std::string buf(4096, '\0');
        for (int attempt = 0;; ++attempt) {
            std::size_t len = 0;
            const kvt_status s = api_.tier_metrics(tier_, &buf[0], buf.size(), &len);
            if (s == KVT_STATUS_OK) {
                buf.resize(len);
                return buf;
            }
            if (s != KVT_STATUS_INVALID_ARGUMENT || len < buf.size() || attempt >= 8) {
                check(api_, s, "kvt_tier_metrics");
                throw Error(s, "kvt_tier_metrics: the text kept growing");
            }
            buf.assign(len + 1 + len / 8, '\0'); // room for the NUL and a little growth
        }
    }

    // Where the tier's objects are, in words (store kind, bucket/directory, endpoint,
    // prefix/namespace), for logs and metric labels; never holds a credential. Copied out
    // of the tier-owned string (valid until kvt_tier_free, also after shutdown()).
    // Throws Error(KVT_STATUS_STATE) when the library returns NULL (an invalid tier, or a
    // fork() child of the tier's process). Thread-safe.
    std::string location() const
    {
        const char *l = api_.tier_location(tier_);
        if (l == nullptr) {
            throw Error(KVT_STATUS_STATE, "kvt_tier_location: no location (empty, invalid or forked tier)");
        }
        return l;
    }

private:
    // How many key_len-byte keys `keys` holds; throws when it is not a whole number.
    static std::size_t whole_keys(const char *what, Span<std::uint8_t> keys, std::size_t key_len)
    {
        if (key_len == 0 || keys.size() % key_len != 0) {
            throw Error(KVT_STATUS_INVALID_ARGUMENT,
                        std::string(what) + ": the key buffer is not a whole number of key_len-byte keys", false);
        }
        return keys.size() / key_len;
    }

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

    kvt_status submit_ranges(kvt_job_kind kind, std::uint64_t job_id, Span<Range> ranges,
                             std::size_t ranges_per_key, Span<std::uint8_t> keys, std::size_t key_len,
                             bool throw_on_error)
    {
        const std::size_t n = key_len == 0 ? 0 : keys.size() / key_len;
        const bool ok = key_len != 0 && ranges_per_key != 0 && keys.size() % key_len == 0 &&
                        ranges.size() / ranges_per_key == n && ranges.size() % ranges_per_key == 0;
        if (!ok) {
            if (throw_on_error) {
                throw Error(KVT_STATUS_INVALID_ARGUMENT,
                            "kvtier::Tier::submit_ranges: " + std::to_string(ranges.size()) + " ranges and " +
                                std::to_string(keys.size()) + " key bytes are not " + std::to_string(ranges_per_key) +
                                " ranges per key of " + std::to_string(key_len) + " bytes; nothing was submitted",
                            false);
            }
            return KVT_STATUS_INVALID_ARGUMENT;
        }
        const kvt_status s =
            kind == KVT_JOB_KIND_STORE
                ? api_.tier_submit_store_ranges(tier_, job_id, ranges.data(), ranges_per_key, keys.data(), key_len, n)
                : api_.tier_submit_load_ranges(tier_, job_id, ranges.data(), ranges_per_key, keys.data(), key_len, n);
        if (throw_on_error) {
            check(api_, s, kind == KVT_JOB_KIND_STORE ? "kvt_tier_submit_store_ranges" : "kvt_tier_submit_load_ranges");
        }
        return s;
    }

    static Event copy_event(const kvt_event &e, bool removed)
    {
        Event c;
        c.job_id = e.job_id;
        c.key_len = e.key_len;
        if (e.keys != nullptr && e.num_keys > 0 && e.key_len > 0) {
            c.keys.assign(e.keys, e.keys + e.num_keys * e.key_len);
        }
        c.medium = e.medium ? e.medium : "";
        c.locality = e.locality;
        c.removed = removed;
        return c;
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

// ---- Functions that need no tier. All are thread-safe and work in a fork() child.

// A short static description of a status code (kvt_status_str).
inline std::string status_str(const Api &api, kvt_status status) { return api.status_str(static_cast<int>(status)); }

// The configuration schema as a JSON document (kvt_config_schema; static in the library,
// copied here).
inline std::string config_schema(const Api &api) { return api.config_schema(); }

// The counters of Stats, in field order, as a JSON array of {"name", "help"}
// (kvt_stats_fields; static in the library, copied here).
inline std::string stats_fields(const Api &api) { return api.stats_fields(); }

// Checks a configuration exactly as Tier's constructor does, without opening or probing
// its store (kvt_config_check). Throws Error(KVT_STATUS_CONFIG) naming the offending key.
inline void config_check(const Api &api, const std::string &config_json)
{
    check(api, api.config_check(config_json.c_str()), "kvt_config_check");
}

// vLLM's namespace string for `fields_json` (the JSON object of hashed fields) and `rank`
// (kvt_vllm_namespace). Throws Error (KVT_STATUS_CONFIG / _INVALID_ARGUMENT for a bad
// field set).
inline std::string vllm_namespace(const Api &api, const std::string &fields_json, std::uint32_t rank)
{
    std::size_t len = 0;
    std::string buf(128, '\0');
    kvt_status s = api.vllm_namespace(fields_json.c_str(), rank, &buf[0], buf.size(), &len);
    if (s == KVT_STATUS_INVALID_ARGUMENT && len >= buf.size()) {
        buf.assign(len + 1, '\0');
        s = api.vllm_namespace(fields_json.c_str(), rank, &buf[0], buf.size(), &len);
    }
    check(api, s, "kvt_vllm_namespace");
    buf.resize(len);
    return buf;
}

// ---- Logging (kvt_set_log_callback). Process-wide: one callback for every tier and
// every Api (they share the one library).
//
// The raw form: routes the library's log records to `callback(userdata, level, target,
// message)`; records more verbose than max_level are dropped. nullptr restores the
// default (stderr, filtered by RUST_LOG). The callback may run on any library thread,
// several at once; it must not block for long, throw/unwind, or call set_log_callback;
// `target` and `message` are valid only during the call. When this returns, the previous
// callback is not running and will never be called again, so its userdata may be freed.
// Throws Error(KVT_STATUS_INVALID_ARGUMENT) for a max_level outside kvt_log_level.
inline void set_log_callback(const Api &api, kvt_log_callback callback, void *userdata,
                             kvt_log_level max_level = KVT_LOG_LEVEL_INFO)
{
    check(api, api.set_log_callback(callback, userdata, static_cast<int>(max_level)), "kvt_set_log_callback");
}

// The owning form: installs `handler` (a std::function, which this object owns) as the
// log callback for this object's lifetime; the destructor restores the default (stderr)
// and only then destroys the std::function, which is safe because the library guarantees
// the previous callback is no longer running once kvt_set_log_callback returns.
// Exceptions thrown by the handler are swallowed (they must not unwind into the library).
// Not copyable or movable; keep at most one alive at a time (a second one replaces the
// first's callback, and the first's destructor would then reset the second's). Like the
// raw form, the handler may run on any library thread, concurrently with itself.
class LogCallback {
public:
    using Handler = std::function<void(kvt_log_level level, const char *target, const char *message)>;

    LogCallback(const Api &api, Handler handler, kvt_log_level max_level = KVT_LOG_LEVEL_INFO)
        : api_(api), handler_(new Handler(std::move(handler)))
    {
        try {
            set_log_callback(api_, &LogCallback::trampoline, handler_, max_level);
        } catch (...) {
            delete handler_;
            throw;
        }
    }
#ifndef KVTIER_HPP_NO_LINKED_API
    explicit LogCallback(Handler handler, kvt_log_level max_level = KVT_LOG_LEVEL_INFO)
        : LogCallback(Api::linked(), std::move(handler), max_level)
    {
    }
#endif
    ~LogCallback()
    {
        api_.set_log_callback(nullptr, nullptr, KVT_LOG_LEVEL_OFF); // never fails for a valid level
        delete handler_;
    }
    LogCallback(const LogCallback &) = delete;
    LogCallback &operator=(const LogCallback &) = delete;

private:
    static void trampoline(void *userdata, kvt_log_level level, const char *target, const char *message) noexcept
    {
        try {
            (*static_cast<Handler *>(userdata))(level, target ? target : "", message ? message : "");
        } catch (...) {
        }
    }
    Api api_;
    Handler *handler_;
};

#ifndef KVTIER_HPP_NO_LINKED_API
inline std::string status_str(kvt_status status) { return status_str(Api::linked(), status); }
inline std::string config_schema() { return config_schema(Api::linked()); }
inline std::string stats_fields() { return stats_fields(Api::linked()); }
inline void config_check(const std::string &config_json) { config_check(Api::linked(), config_json); }
inline std::string vllm_namespace(const std::string &fields_json, std::uint32_t rank)
{
    return vllm_namespace(Api::linked(), fields_json, rank);
}
inline void set_log_callback(kvt_log_callback callback, void *userdata, kvt_log_level max_level = KVT_LOG_LEVEL_INFO)
{
    set_log_callback(Api::linked(), callback, userdata, max_level);
}
#endif

} // namespace kvtier

#endif // KVTIER_HPP
