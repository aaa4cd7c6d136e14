// Status plumbing used everywhere in Lamina.
//
//   LAMINA_RETURN_IF_ERROR(expr);            returns expr's status if it is not OK.
//   LAMINA_ASSIGN_OR_RETURN(lhs, expr);      unwraps a StatusOr or returns its status.
//   LAMINA_CHECK(cond);                      aborts on a broken invariant (never for bad input).
#ifndef LAMINA_COMMON_STATUS_STATUS_MACROS_H_
#define LAMINA_COMMON_STATUS_STATUS_MACROS_H_

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LAMINA_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status lamina_status_ = (expr);          \
    if (!lamina_status_.ok()) return lamina_status_; \
  } while (0)

#define LAMINA_STATUS_CONCAT_INNER_(a, b) a##b
#define LAMINA_STATUS_CONCAT_(a, b) LAMINA_STATUS_CONCAT_INNER_(a, b)

#define LAMINA_ASSIGN_OR_RETURN(lhs, expr) \
  LAMINA_ASSIGN_OR_RETURN_IMPL_(LAMINA_STATUS_CONCAT_(lamina_statusor_, __COUNTER__), lhs, expr)

#define LAMINA_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#define LAMINA_CHECK(cond)                                                            \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: LAMINA_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)

#endif  // LAMINA_COMMON_STATUS_STATUS_MACROS_H_
