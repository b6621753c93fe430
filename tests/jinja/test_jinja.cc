// The Jinja interpreter (jinja/jinja.h): 40 real chat templates (tests/data/chat-templates/
// jinja: models' own, copied by llama.cpp and vLLM, and the six of templates.json) rendered on
// the conversation corpus give jinja2's text byte for byte, as transformers sets jinja2 up
// (tests/scripts/make_jinja_fixtures.py), and fail where it failed; then the rules one by one:
// whitespace control, scoping, Python's printing, errors that name the line, the budgets.
#include <gtest/gtest.h>

#include <ctime>

#include "engine/base/error.h"
#include "engine/base/json.h"
#include "jinja/jinja.h"
#include "tests/test_util.h"

using namespace kvpr;
using kvpr::jinja::Template;
using kvpr::jinja::Value;

namespace {

// strftime_now at the fixtures' fixed time (2026-01-15 10:30).
Value fixed_strftime_now() {
  return Value::callable(
      [](const jinja::Args& a) {
        std::tm tm{};
        tm.tm_year = 2026 - 1900;
        tm.tm_mon = 0;
        tm.tm_mday = 15;
        tm.tm_hour = 10;
        tm.tm_min = 30;
        tm.tm_wday = 4;  // a Thursday
        tm.tm_yday = 14;
        char buf[128];
        const std::string fmt = a.positional.empty() ? "" : a.positional[0].str();
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
#pragma GCC diagnostic pop
        return Value(std::string(buf, n));
      },
      "strftime_now");
}

std::string render(const std::string& source, const json::Value& vars = json::Value(json::Object{})) {
  return Template(source).render(Value::from_json(vars));
}

std::string error_of(const std::string& source, const json::Value& vars = json::Value(json::Object{})) {
  try {
    render(source, vars);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Where two texts first differ, with a little of both around it.
std::string first_difference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  return "at byte " + std::to_string(i) + ": want ..." + json::Value(want.substr(from, 80)).dump() + "... got ..." +
         json::Value(got.substr(from, 80)).dump() + "...";
}

}  // namespace

TEST(Jinja, RealTemplatesRenderAsJinja2Does) {
  const json::Value fixtures = json::parse(test::read_file(test::data_path("chat-templates/jinja/rendered.json")));
  const json::Value templates_json = json::parse(test::read_file(test::data_path("chat-templates/templates.json")));
  std::map<std::string, std::unique_ptr<Template>> parsed;
  int checked = 0, errors = 0;
  for (const auto& c : fixtures.find("cases")->as_array()) {
    const std::string name = c.find("template")->as_string();
    auto& t = parsed[name];
    if (!t) {
      const std::string source =
          name.rfind("known/", 0) == 0
              ? templates_json.find(name.substr(6))->find("chat_template")->as_string()
              : test::read_file(test::data_path("chat-templates/jinja/" + name + ".jinja"));
      try {
        t = std::make_unique<Template>(source);
      } catch (const Error& e) {
        ADD_FAILURE() << name << ": " << e.what();
        t = std::make_unique<Template>("");
        continue;
      }
    }
    const json::Value& conv = *fixtures.find("conversations")->find(c.find("conversation")->as_string());
    jinja::Dict vars;
    for (const auto& [k, v] : c.find("variables")->as_object()) vars.emplace_back(k, Value::from_json(v));
    vars.emplace_back("messages", Value::from_json(*conv.find("messages")));
    const json::Value* tools = conv.find("tools");
    vars.emplace_back("tools", tools ? Value::from_json(*tools) : Value::none());
    vars.emplace_back("strftime_now", fixed_strftime_now());
    const std::string where = name + " / " + c.find("conversation")->as_string() + " / " + c.find("variables")->dump();
    ++checked;
    if (const json::Value* err = c.find("error")) {
      ++errors;
      try {
        const std::string got = t->render(Value(std::move(vars)));
        ADD_FAILURE() << where << ": jinja2 failed (" << err->as_string() << "), kvpr rendered " << got.size()
                      << " bytes";
      } catch (const Error& e) {
        if (c.find("raised")->as_bool()) {  // the template's own message
          EXPECT_NE(std::string(e.what()).find(err->as_string()), std::string::npos) << where << ": " << e.what();
        }
      }
      continue;
    }
    const std::string want = c.find("text")->as_string();
    try {
      const std::string got = t->render(Value(std::move(vars)));
      EXPECT_EQ(got, want) << where << " " << first_difference(want, got);
    } catch (const Error& e) {
      ADD_FAILURE() << where << ": " << e.what();
    }
  }
  EXPECT_EQ(parsed.size(), 40u);
  EXPECT_GE(checked, 800);
  EXPECT_GT(errors, 0);
}

TEST(Jinja, WhitespaceControlAsTransformersSetsItUp) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the indentation before one.
  EXPECT_EQ(render("{% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  EXPECT_EQ(render("  {% if true %}\n  x\n  {% endif %}\n"), "  x\n");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("a\n  {{- 'b' -}}\n  c"), "abc");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");  // + keeps the indentation
  EXPECT_EQ(render("{% if true +%}\nx{% endif %}"), "\nx");  // + keeps the newline
  EXPECT_EQ(render("{{ 'a' }}\n{{ 'b' }}"), "a\nb");         // not after {{ }}
  EXPECT_EQ(render("a {# note #}\nb"), "a b");
  EXPECT_EQ(render("x\r\ny\n"), "x\ny");  // newlines normalised, one trailing newline dropped
  EXPECT_EQ(render("{% raw %}{{ not }}{% endraw %}"), "{{ not }}");
}

TEST(Jinja, ScopesAsJinja2Has) {
  // An iteration's variables are its own; a namespace carries values out of a loop.
  EXPECT_EQ(render("{% set x = 5 %}{% for i in [1, 2] %}{% set x = i %}{{ x }}{% endfor %}{{ x }}"), "125");
  // A set block's and a filter block's bodies set in scopes of their own.
  EXPECT_EQ(render("{% set x = 1 %}{% set y %}{% set x = 2 %}{{ x }}{% endset %}{{ x }}{{ y }}"), "12");
  EXPECT_EQ(render("{% set x = 1 %}{% filter upper %}{% set x = 2 %}{{ x }}{% endfilter %}{{ x }}"), "21");
  EXPECT_EQ(render("{% for i in [1, 2, 3] %}{% if i == 1 %}{% set x = i %}{% endif %}{{ x }}{% endfor %}|"), "1|");
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% for i in [1, 2] %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}"),
            "4");
  // A macro sees the template's variables when called, not its caller's.
  EXPECT_EQ(render("{% set y = 3 %}{% macro m() %}{{ y }}{% endmacro %}{% for i in [1] %}{% set y = 4 %}{{ m() }}"
                   "{% endfor %}"),
            "3");
  EXPECT_EQ(render("{% macro f(a, b=2) %}{{ a }}-{{ b }}{% endmacro %}{{ f(1) }} {{ f(1, b=3) }} {{ f(b=5, a=4) }}"),
            "1-2 1-3 4-5");
  EXPECT_EQ(render("{% macro f() %}[{{ caller() }}]{% endmacro %}{% call f() %}in{% endcall %}"), "[in]");
  EXPECT_EQ(render("{% for m in [1, 2, 3] if m > 1 %}{{ loop.index }}/{{ loop.length }}{{ m }} {% else %}none"
                   "{% endfor %}"),
            "1/22 2/23 ");
  EXPECT_EQ(render("{% for a in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for a in [1, 2, 3] %}{% if a == 2 %}{% continue %}{% endif %}{% if a == 3 %}{% break %}"
                   "{% endif %}{{ a }}{{ loop.cycle('x', 'y') }}{% endfor %}"),
            "1x");
}

TEST(Jinja, ValuesPrintAsPythonPrintsThem) {
  EXPECT_EQ(render("{{ 1/2 }} {{ 7//2 }} {{ -7 % 3 }} {{ 2**10 }} {{ 1.0 }} {{ 1e20 }} {{ [1, 'a', none, true] }}"),
            "0.5 3 2 1024 1.0 1e+20 [1, 'a', None, True]");
  EXPECT_EQ(render("{{ x }}|{{ x|length }}|{{ x ~ 'a' }}"), "|0|a");
  EXPECT_EQ(render("{{ 'h\u00e9llo'[1] }}{{ 'abc'[::-1] }} {{ [1, 2, 3][1:] }}"), "\u00e9cba [2, 3]");
  EXPECT_EQ(render("{{ x|tojson }}", json::parse(R"({"x": {"a": [1, 2.5, "\u00e9", null]}})")),
            "{\"a\": [1, 2.5, \"\u00e9\", null]}");
  EXPECT_EQ(render("{{ x|tojson(indent=2) }}", json::parse(R"({"x": {"a": [1]}})")), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{{ '%s and %d' % ('a', 3) }} {{ 'a,b'.split(',') }} {{ ' a  b '.split() }}"),
            "a and 3 ['a', 'b'] ['a', 'b']");
  EXPECT_EQ(render("{{ d.items()|list }} {{ d['items'] }}", json::parse(R"({"d": {"items": 1}})")), "[('items', 1)] 1");
  // Tuples print as Python prints them and equal no list.
  EXPECT_EQ(render("{{ (1, 'a') }} {{ (1,) }} {{ () }} {% set t = 1, 2 %}{{ t }} {{ (1, 2) == [1, 2] }} {{ (1, 2) == (1, 2) }}"),
            "(1, 'a') (1,) () (1, 2) False True");
  EXPECT_EQ(render("{{ (1,) + (2,) }} {{ (1, 2, 3)[1:] }} {{ [1] + [2] }} {{ '%s' % [1, 2] }} {{ '%s-%s'|format(1, 2) }}"),
            "(1, 2) (2, 3) [1, 2] [1, 2] 1-2");
  EXPECT_NE(error_of("{{ (1,) + [2] }}").find("can only concatenate tuple (not \"list\") to tuple"), std::string::npos);
  // Case beyond ASCII (Unicode's simple mappings).
  EXPECT_EQ(render("{{ 'Été Δε'|lower }} {{ 'été'|upper }} {{ 'naïve école'|title }} "
                   "{{ 'éCOLE'|capitalize }} {{ 'Ж'.lower() }}"),
            "été δε ÉTÉ Naïve École École ж");
  EXPECT_EQ(render("{{ 'ΟΔΥΣΣΕΥΣ Σ'|lower }} {{ 'İ'.lower() }}"), "οδυσσευς σ i\u0307");
  EXPECT_EQ(render("{{ 'x' in 'axb' }} {{ 'a' in {'a': 1} }} {{ 1 not in [2] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}"),
            "True True True True False");
  EXPECT_EQ(render("{{ none|default('d') }} {{ ''|default('d', true) }} {{ u|default('d') }}"), "None d d");
  EXPECT_EQ(render("{{ 'hello world'|title }} {{ 'a\nb'|indent(2) }} {{ 3.7|round(0, 'floor') }} {{ 2.5|round }}"),
            "Hello World a\n  b 3.0 2.0");
}

TEST(Jinja, ErrorsNameTheLine) {
  EXPECT_NE(error_of("a\n{% include 'x' %}").find("line 2: the tag 'include' is not supported"), std::string::npos);
  EXPECT_NE(error_of("a\n\n{{ x | frobnicate }}").find("line 3: no filter named 'frobnicate'"), std::string::npos);
  EXPECT_NE(error_of("{{ x is shiny }}").find("line 1: no test named 'shiny'"), std::string::npos);
  EXPECT_NE(error_of("{% if x %}").find("the template ends before endif"), std::string::npos);
  EXPECT_NE(error_of("{{ 'abc }}").find("a string is not closed"), std::string::npos);
  EXPECT_EQ(error_of("{{ raise_exception('Roles must alternate') }}"), "Roles must alternate");
  EXPECT_NE(error_of("\n{{ foo.bar }}").find("line 2: 'foo' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ x.y.z }}", json::parse(R"({"x": {}})")).find("'dict object' has no attribute 'y'"),
            std::string::npos);
  EXPECT_NE(error_of("{{ none + 'a' }}").find("unsupported operand type(s) for +"), std::string::npos);
  EXPECT_NE(error_of("{% break %}").find("'break' outside a loop"), std::string::npos);
}

TEST(Jinja, DepthStepAndOutputBudgets) {
  // Nesting past the parser's depth limit is an error, not a stack overflow.
  const std::string deep = std::string(5000, '(') + "1" + std::string(5000, ')');
  EXPECT_NE(error_of("{{ " + deep + " }}").find("nested deeper than"), std::string::npos);
  std::string chain = "{{ x";  // left-deep chains recurse as deep when evaluated
  for (int i = 0; i < 100000; ++i) chain += "|trim";
  EXPECT_NE(error_of(chain + " }}").find("nested deeper than"), std::string::npos);
  std::string concat = "{{ 'a'";
  for (int i = 0; i < 100000; ++i) concat += " ~ 'a'";
  EXPECT_NE(error_of(concat + " }}").find("nested deeper than"), std::string::npos);
  // Values nested past the limit are refused where they are made.
  EXPECT_NE(error_of("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}"
                     "{{ ns.x }}")
                .find("nested deeper than"),
            std::string::npos);
  std::string ifs;
  for (int i = 0; i < 400; ++i) ifs += "{% if true %}";
  EXPECT_NE(error_of(ifs).find("nested deeper than"), std::string::npos);
  // A loop that would run for ever within the range() budget stops at the step budget.
  jinja::Limits small;
  small.max_steps = 100000;
  try {
    Template("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", small)
        .render(Value::from_json(json::Object{}));
    ADD_FAILURE() << "rendered";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("budget"), std::string::npos) << e.what();
  }
  // As jinja2's sandbox: no range past 100000 items.
  EXPECT_NE(error_of("{{ range(1000000)|length }}").find("Range too big"), std::string::npos);
  // Recursion stops at the call depth.
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("macros nested deeper than"),
            std::string::npos);
  // Output doubling stops at the output budget.
  jinja::Limits out;
  out.max_output = 1 << 16;
  try {
    Template("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
             out)
        .render(Value::from_json(json::Object{}));
    ADD_FAILURE() << "rendered";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("budget"), std::string::npos) << e.what();
  }
}

TEST(Jinja, HostileValuesAreErrorsNotCrashes) {
  // Integers past 64 bits, a slice step that would wrap, a caller kept past its block, a
  // repetition that would overflow its size, JSON of what is not JSON: each one error.
  EXPECT_NE(error_of("{{ (-9223372036854775807 - 1) // -1 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ 2 ** 64 }}").find("integer overflow"), std::string::npos);
  EXPECT_EQ(render("{{ (-1) ** 65 }} {{ 7 % -1 }} {{ 6 is divisibleby(-1) }}"), "-1 0 True");
  EXPECT_EQ(render("{{ [1, 2, 3][1::9223372036854775807] }} {{ [1, 2, 3][::-9223372036854775807] }}"), "[2] [3]");
  EXPECT_NE(error_of("{{ 'ab' * 4611686018427387904 }}").find("budget"), std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(c=none) %}{% macro m() %}{% set ns.c = caller %}{% endmacro %}"
                     "{% call m() %}x{% endcall %}{{ ns.c() }}")
                .find("after its call block ended"),
            std::string::npos);
  EXPECT_NE(error_of("{% macro m() %}{{ caller() }}{% endmacro %}{% call(x) m() %}{{ x.y }}{% endcall %}")
                .find("'x' is undefined"),
            std::string::npos);
  EXPECT_NE(error_of("{{ x|tojson }}").find("Undefined is not JSON serializable"), std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace() %}{% set ns.s = ns %}{{ ns|tojson }}").find("Namespace is not JSON"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'a'|indent(-1) }}").find("width must be"), std::string::npos);
  EXPECT_NE(error_of("{{ [[1]]|tojson(indent=2147483647) }}").find("indent must be"), std::string::npos);
  EXPECT_EQ(render("{{ [[1]]|map(attribute='99999999999999999999')|list }}"), "[Undefined]");
}

TEST(Jinja, DetailsAsJinja2Has) {
  EXPECT_EQ(render("{{ {'a': {'b': 1}} }}"), "{'a': {'b': 1}}");  // "}}" inside braces does not end the tag
  EXPECT_EQ(render("{{ '%s'|format(x) }}", json::parse("{\"x\": \"" + std::string(600, 'y') + "\"}")),
            std::string(600, 'y'));
  EXPECT_EQ(render("[{{ '%5s|%-3s|%.2s' % ('ab', 'c', 'xyz') }}]"), "[   ab|c  |xy]");
  EXPECT_EQ(render("{{ 2.835|round(2) }} {{ 1234|round(-2) }}"), "2.83 1200");
  EXPECT_EQ(render("{% for x in xs|sort(attribute='a', reverse=true) %}{{ x.n }}{% endfor %} {{ ['B', 'b']|max }}",
                   json::parse(R"({"xs": [{"a": 1, "n": "x"}, {"a": 1, "n": "y"}, {"a": 0, "n": "z"}]})")),
            "xyz B");
  EXPECT_EQ(render("{% raw %}\nfoo{% endraw %}"), "\nfoo");  // trim_blocks is endraw's only
  EXPECT_EQ(render("a\x0bb"), "a\x0bb");                      // only \r\n, \r and \n are newlines
}
