# doxygen's input filter for the API reference (INPUT_FILTER in docs/Doxyfile): it lets each
# option declared with XGRAD_ARG, XGRAD_REQUIRED_ARG or XGRAD_NESTED_ARG (core/arg.hpp) appear as
# the getter and the chainable setter the macro declares. It renames the macro on such a line to
# XGRAD_DOC_ARG_, XGRAD_DOC_REQUIRED_ARG_ or XGRAD_DOC_NESTED_ARG_ with the enclosing struct's name
# as a first argument (the setter returns that struct; the macro itself says auto&), and it moves
# the line's trailing `///<` comment in front of the macro, so that the comment, like a `///` line
# above the macro, documents the getter (the first declaration of the expansion; PREDEFINED in
# docs/Doxyfile). For XGRAD_NESTED_ARG it drops the trailing underscore of the nested member, which
# leaves the public getter that returns the nested options. Every line stays on its own line, so
# warnings name the header's own line numbers. Other lines pass unchanged.
/^[ \t]*(struct|class)[ \t]+[A-Za-z_][A-Za-z0-9_]*[^;]*[{:][^;]*$/ {
  name = $0
  sub(/^[ \t]*(struct|class)[ \t]+/, "", name)
  sub(/[^A-Za-z0-9_].*$/, "", name)
  options_struct = name
}
/^[ \t]*XGRAD_(ARG|REQUIRED_ARG|NESTED_ARG)\(/ {
  line = $0
  comment = ""
  at = index(line, "///<")
  if (at > 0) {
    comment = substr(line, at + 4)
    line = substr(line, 1, at - 1)
    sub(/^[ \t]*/, "", comment)
    sub(/[ \t]*$/, "", line)
  }
  indent = line
  sub(/[^ \t].*$/, "", indent)
  macro = substr(line, length(indent) + 1)
  args = macro
  sub(/\(.*$/, "", macro)
  sub(/^[A-Z_]*\(/, "", args)
  if (macro == "XGRAD_NESTED_ARG") {
    n = split(args, part, ",")
    sub(/_[ \t]*$/, "", part[n - 1])
    args = part[1]
    for (i = 2; i <= n; i++) args = args "," part[i]
  }
  if (comment != "") indent = indent "/** " comment " */ "
  print indent "XGRAD_DOC_" substr(macro, 7) "_(" options_struct ", " args
  next
}
{ print }
