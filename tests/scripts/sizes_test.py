"""scripts/sizes.py's reading of C++: a function's size is its lines from
its header to its closing brace, whatever its literals hold."""
import pathlib
import sys
import tempfile
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
import sizes  # noqa: E402


class FunctionsTest(unittest.TestCase):
    def sizes_of(self, text):
        with tempfile.TemporaryDirectory() as where:
            path = pathlib.Path(where) / "f.cc"
            path.write_text(text)
            return {name: size for name, _, size in sizes.functions(path)}

    def test_a_digit_separator_is_not_a_character_literal(self):
        found = self.sizes_of("void A() {\n  int x{50'000};\n  f({1'0, 0x1'F'u});\n}\n"
                              "void B() {\n  g();\n}\n")
        self.assertEqual(found, {"A": 4, "B": 3})

    def test_braces_in_strings_comments_and_characters_do_not_count(self):
        found = self.sizes_of("void A() {\n  char c = '{';\n  auto s = \"}{\"; // }\n  /* { */\n}\n"
                              "void B() {\n}\n")
        self.assertEqual(found, {"A": 5, "B": 2})


if __name__ == "__main__":
    unittest.main()
