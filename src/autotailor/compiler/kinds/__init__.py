"""Variable kinds beyond the four in ``compiler.variables``, one module each. Importing this
package registers them."""

from autotailor.compiler.kinds import embedding, heads, qk, v  # noqa: F401
