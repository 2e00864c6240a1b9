/// @file
/// XGRAD_ARG declares one option of an options struct: a field with its default, a getter and
/// a chainable setter, so that MultiHeadAttentionOptions(512, 8).dropout(0.1).norm(Norm::pre)
/// reads like the sentence it is. XGRAD_REQUIRED_ARG declares one the struct's constructor sets
/// (a required value such as d_model, or one derived from them): it has no default of its own.
#pragma once

/// The getter and the chainable setter that both macros declare; the field follows them.
/// The setter returns the struct itself; what follows the macro is private.
#define XGRAD_ARG_ACCESSORS_(T, name)       \
 public:                                    \
  auto& name(const T& v) {                  \
    name##_ = v;                            \
    return *this;                           \
  }                                         \
  const T& name() const { return name##_; } \
                                            \
 private:

/// Option `name` of type T with its default: getter name(), setter name(v), private field name_.
#define XGRAD_ARG(T, name, default_value) XGRAD_ARG_ACCESSORS_(T, name) T name##_ = default_value
/// Option `name` of type T that the struct's constructor sets: getter, setter, private field name_.
#define XGRAD_REQUIRED_ARG(T, name) XGRAD_ARG_ACCESSORS_(T, name) T name##_

/// Option `name` of type T held by a nested options struct: getter name() returns member.inner(),
/// setter name(v) sets it and returns the outer struct. An options struct that is composed of
/// others (a block's of its attention's and feed-forward's) offers their fields this way, so
/// each field is stored once.
#define XGRAD_NESTED_ARG(T, name, member, inner)   \
 public:                                           \
  auto& name(const T& v) {                         \
    member.inner(v);                               \
    return *this;                                  \
  }                                                \
  const T& name() const { return member.inner(); } \
                                                   \
 private:
