#include "engine/constrain/decimal.h"

#include <algorithm>
#include <cstdint>

#include "engine/constrain/json_lex.h"

namespace kvpr::decimal {

Dec normalized(bool neg, std::string i, std::string f) {
  size_t a = 0;
  while (a < i.size() && i[a] == '0') ++a;
  i.erase(0, a);
  while (!f.empty() && f.back() == '0') f.pop_back();
  Dec d{neg, std::move(i), std::move(f)};
  if (d.i.empty() && d.f.empty()) d.neg = false;
  return d;
}

// -?digits(.digits)?([eE][+-]?digits)? (a JSON number, or Python's repr of a float).
Dec parse_dec(std::string_view s) {
  bool neg = false;
  size_t p = 0;
  if (p < s.size() && (s[p] == '-' || s[p] == '+')) neg = s[p++] == '-';
  std::string i, f;
  while (p < s.size() && json_lex::is_digit(static_cast<uint8_t>(s[p]))) i += s[p++];
  if (p < s.size() && s[p] == '.') {
    ++p;
    while (p < s.size() && json_lex::is_digit(static_cast<uint8_t>(s[p]))) f += s[p++];
  }
  int64_t e = 0;
  if (p < s.size() && (s[p] == 'e' || s[p] == 'E')) e = std::stoll(std::string(s.substr(p + 1)));
  if (e > 0) {  // move the point right
    const size_t take = std::min<size_t>(static_cast<size_t>(e), f.size());
    i += f.substr(0, take);
    f.erase(0, take);
    i.append(static_cast<size_t>(e) - take, '0');
  } else if (e < 0) {  // left
    const size_t take = std::min<size_t>(static_cast<size_t>(-e), i.size());
    f = i.substr(i.size() - take) + f;
    i.resize(i.size() - take);
    f.insert(0, static_cast<size_t>(-e) - take, '0');
  }
  return normalized(neg, std::move(i), std::move(f));
}

int cmp_magnitude(const Dec& a, const Dec& b) {
  if (a.i.size() != b.i.size()) return a.i.size() < b.i.size() ? -1 : 1;
  if (const int c = a.i.compare(b.i)) return c < 0 ? -1 : 1;
  if (const int c = a.f.compare(b.f)) return c < 0 ? -1 : 1;  // no trailing zeros: plain order works
  return 0;
}

int cmp(const Dec& a, const Dec& b) {
  if (a.neg != b.neg) return a.neg ? -1 : 1;
  const int m = cmp_magnitude(a, b);
  return a.neg ? -m : m;
}

// The integer of `digits` plus one.
std::string inc_digits(std::string d) {
  for (size_t k = d.size(); k-- > 0;) {
    if (d[k] != '9') {
      ++d[k];
      return d;
    }
    d[k] = '0';
  }
  return "1" + d;
}

// The integer of positive `digits` minus one.
std::string dec_digits(std::string d) {
  for (size_t k = d.size(); k-- > 0;) {
    if (d[k] != '0') {
      --d[k];
      return d;
    }
    d[k] = '9';
  }
  return d;
}

// An integer decimal plus one.
Dec plus_one(const Dec& d) {
  if (!d.neg) return normalized(false, inc_digits(d.i.empty() ? "0" : d.i), "");
  return normalized(true, dec_digits(d.i), "");
}

std::string dec_text(const Dec& d) {
  std::string t = (d.neg ? "-" : "") + (d.i.empty() ? std::string("0") : d.i);
  if (!d.f.empty()) t += "." + d.f;
  return t;
}

// floor and ceil of a decimal, as integer decimals.
Dec floor_dec(const Dec& d) { return d.f.empty() || !d.neg ? normalized(d.neg, d.i, "") : normalized(true, inc_digits(d.i), ""); }
Dec ceil_dec(const Dec& d) { return d.f.empty() || d.neg ? normalized(d.neg, d.i, "") : normalized(false, inc_digits(d.i), ""); }
Dec negated(Dec d) {
  if (!d.i.empty() || !d.f.empty()) d.neg = !d.neg;
  return d;
}


// Some real x with lo <= x <= hi (each end as it says) exists.
bool overlap(const End& lo, const End& hi) {
  if (!lo.finite || !hi.finite) return true;
  const int c = cmp(lo.v, hi.v);
  return c < 0 || (c == 0 && lo.inclusive && hi.inclusive);
}

// [a, b) (b none: unbounded) meets the allowed [L, H] (their ends as they say).
bool meets(const Dec& a, const End& b, const End& L, const End& H) {
  End lo{true, true, a};
  if (L.finite) {
    const int c = cmp(a, L.v);
    if (c < 0) lo = L;
    else if (c == 0) lo.inclusive = L.inclusive;
  }
  End hi = b;
  if (H.finite && (!hi.finite || cmp(H.v, hi.v) < 0)) hi = H;
  else if (H.finite && cmp(H.v, hi.v) == 0) hi.inclusive = hi.inclusive && H.inclusive;
  return overlap(lo, hi);
}

}  // namespace kvpr::decimal
