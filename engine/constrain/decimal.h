// Exact decimal arithmetic for JSON Schema's numeric bounds (minimum, exclusiveMaximum, ...):
// numbers as digit strings, so that a bound of 0.1 or 1e300 is the number written, not the
// nearest double; json_schema.cc compiles bounds and checks generated numbers with them.
#pragma once

#include <string>
#include <string_view>

namespace kvpr::decimal {

// A decimal number: sign, integer digits without leading zeros ("" for 0), fraction digits
// without trailing zeros. Zero is never negative.
struct Dec {
  bool neg = false;
  std::string i, f;
};

// One end of an interval: a value, or none (infinite), included or not.
struct End {
  bool finite = false, inclusive = true;
  Dec v;
};

Dec normalized(bool neg, std::string i, std::string f);
// -?digits(.digits)?([eE][+-]?digits)? (a JSON number, or Python's repr of a float).
Dec parse_dec(std::string_view s);
int cmp_magnitude(const Dec& a, const Dec& b);
int cmp(const Dec& a, const Dec& b);  // -1, 0 or 1, as a < b, a == b, a > b
// The integer of `digits` plus one.
std::string inc_digits(std::string d);
// The integer of positive `digits` minus one.
std::string dec_digits(std::string d);
// An integer decimal plus one.
Dec plus_one(const Dec& d);
std::string dec_text(const Dec& d);
// floor and ceil of a decimal, as integer decimals.
Dec floor_dec(const Dec& d);
Dec ceil_dec(const Dec& d);
Dec negated(Dec d);
// Some real x with lo <= x <= hi (each end as it says) exists.
bool overlap(const End& lo, const End& hi);
// [a, b) (b none: unbounded) meets the allowed [L, H] (their ends as they say).
bool meets(const Dec& a, const End& b, const End& L, const End& H);

}  // namespace kvpr::decimal
