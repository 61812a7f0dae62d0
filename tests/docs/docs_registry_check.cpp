// The documentation against the registry: README.md's method count and docs/methods.md's
// catalogue read from the source tree at test time, so a method registered (or removed)
// without its documentation fails here. A program of its own rather than part of
// numattn_tests: it needs only the registry, and builds in seconds.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "numattn/attention/registry.h"

namespace {

std::string read_source_file(const std::string& rel) {
  const std::string path = std::string(NUMATTN_SOURCE_DIR) + "/" + rel;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> registered_names() {
  std::vector<std::string> names;
  for (const numattn::MethodInfo* m : numattn::list_methods()) names.push_back(m->name);
  return names;
}

TEST(Docs, ReadmeMethodCountIsTheRegistrys) {
  const std::string readme = read_source_file("README.md");
  const std::size_t registered = registered_names().size();
  // Every "<number> methods" / "<number> registered methods" in the README is a count of them.
  const std::regex count(R"((\d+) (?:registered )?methods\b)");
  int found = 0;
  for (auto it = std::sregex_iterator(readme.begin(), readme.end(), count); it != std::sregex_iterator();
       ++it) {
    ++found;
    EXPECT_EQ(std::stoul((*it)[1].str()), registered)
        << "README.md says '" << (*it)[0].str() << "' but the registry holds " << registered
        << " methods (`numattn methods`): update the README";
  }
  EXPECT_GT(found, 0) << "README.md gives no method count ('N methods'); the layer table should";
}

TEST(Docs, EveryRegisteredMethodIsInTheCatalogue) {
  const std::string doc = read_source_file("docs/methods.md");
  for (const std::string& name : registered_names()) {
    // A catalogue entry names the method as code: `name` or `name(...)`.
    const bool listed = doc.find("`" + name + "`") != std::string::npos ||
                        doc.find("`" + name + "(") != std::string::npos;
    EXPECT_TRUE(listed) << name << " is registered but docs/methods.md has no `" << name
                        << "` entry: add it to the Families table and describe it";
  }
}

TEST(Docs, FamiliesTableMatchesTheRegistry) {
  const std::string doc = read_source_file("docs/methods.md");
  const std::vector<std::string> names = registered_names();
  const std::set<std::string> known(names.begin(), names.end());
  const std::size_t start = doc.find("\n## Families");
  ASSERT_NE(start, std::string::npos) << "docs/methods.md has no '## Families' section";
  const std::size_t end = doc.find("\n## ", start + 1);
  const std::string table = doc.substr(start, end == std::string::npos ? std::string::npos : end - start);
  const std::regex spec_name(R"(`([a-z]+\.[a-z0-9_]+)[`(])");
  std::set<std::string> listed;
  for (auto it = std::sregex_iterator(table.begin(), table.end(), spec_name); it != std::sregex_iterator();
       ++it) {
    listed.insert((*it)[1].str());
    EXPECT_TRUE(known.count((*it)[1].str()))
        << "docs/methods.md's Families table lists `" << (*it)[1].str()
        << "`, which is not a registered method (`numattn methods`)";
  }
  for (const std::string& name : names)
    EXPECT_TRUE(listed.count(name)) << "docs/methods.md's Families table does not list `" << name
                                    << "`: add it to its family's row";
}

}  // namespace
