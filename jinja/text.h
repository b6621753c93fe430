// Python's string and number semantics that Jinja templates see (str methods, %-formatting,
// slices, floor division), for the renderer and the builtins; by code point over UTF-8.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "jinja/value.h"

namespace kvpr::jinja {

// Python's floor division and modulo on integers (b != 0; INT64_MIN // -1 is refused by the caller).
int64_t floor_div(int64_t a, int64_t b);
int64_t floor_mod(int64_t a, int64_t b);
// str.lower(), and what sort and dictsort compare by: also Python's İ -> i + U+0307 and a Σ that
// ends a word -> ς (a cased letter before it, none after).
std::string to_lower(const std::string& s);
std::string to_upper(const std::string& s);
std::string capitalize(const std::string& s);
// jinja2's title: each part after a run of "-", whitespace, "(", "{", "[" or "<" capitalised.
std::string title(const std::string& s);
// jinja2's escape filter: & < > " ' as entities.
std::string html_escape(const std::string& s);
// Non-ASCII as \uXXXX (surrogate pairs past the BMP): json.dumps with ensure_ascii.
std::string ensure_ascii(const std::string& s);
// Python's split(sep, maxsplit) (sep null: runs of whitespace).
List split(const std::string& s, const std::string* sep, int64_t maxsplit);
// Python's splitlines(keepends).
List splitlines(const std::string& s, bool keepends);
// Python's "fmt % args" for %s %r %d %i %f %x %%, with optional width, zero pad and precision.
std::string percent_format(const std::string& fmt, const Value& args);
// The code point index of byte offset `at` in s.
int64_t cp_index(const std::string& s, size_t at);
// str.startswith / str.endswith: `what` a string or a tuple of them.
bool starts_or_ends(const std::string& s, const Value& what, bool start);
// Python's slice of n items: the indices it selects.
std::vector<int64_t> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step_v);

}  // namespace kvpr::jinja
