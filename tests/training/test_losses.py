"""Label-smoothed cross-entropy (§5.4) without one-hot targets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.training import losses

# Against NumPy or PyTorch written from the papers: compiled as users' programs are (conftest).
pytestmark = pytest.mark.reference_numerics

# Compiled as one program, as a training step compiles them (smoothing and z-loss come from the
# config, constants of the program), rather than operation by operation.
token_losses = jax.jit(losses.token_losses, static_argnums=2, static_argnames="z_loss")
loss_sums = jax.jit(losses.loss_sums, static_argnums=3)


def _dense_reference(logits, labels, eps):
  v = logits.shape[-1]
  q = np.where(np.arange(v) == labels[..., None], 1 - eps, eps / (v - 1))
  x = np.asarray(logits, np.float64)
  logp = x - x.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  return -(q * logp).sum(-1)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.2])
def test_matches_dense_cross_entropy(eps):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 4, 11)).astype(np.float32) * 3
  labels = rng.integers(0, 11, (3, 4))
  loss, nll, _ = token_losses(logits, labels, eps)
  np.testing.assert_allclose(loss, _dense_reference(logits, labels, eps), rtol=1e-5)
  np.testing.assert_allclose(nll, _dense_reference(logits, labels, 0.0), rtol=1e-5)


def test_smoothed_loss_is_minimal_at_smoothed_distribution():
  v, eps = 7, 0.1
  labels = jnp.array([[3]])
  # 1 - ε on the label, ε / (V - 1) on every other token.
  target = jnp.where(jnp.arange(v) == labels[..., None], 1 - eps, eps / (v - 1))
  best = jnp.log(target)  # logits whose softmax is exactly the smoothed targets

  def loss_of(logits):
    return token_losses(logits, labels, eps)[0].sum()

  # The gradient vanishes there, and any perturbation increases the loss.
  np.testing.assert_allclose(jax.grad(loss_of)(best), 0.0, atol=1e-6)
  rng = np.random.default_rng(1)
  for _ in range(20):
    assert loss_of(best + 0.1 * rng.normal(size=best.shape)) > loss_of(best)
  # A one-hot-confident prediction is worse than the smoothed one under smoothing.
  assert loss_of(10.0 * jax.nn.one_hot(labels, v)) > loss_of(best)


def test_sums_ignore_padding_and_summarize():
  logits = np.zeros((1, 3, 5), np.float32)
  labels = np.array([[1, 2, 0]])
  sums = loss_sums(logits, labels, labels > 0, 0.0)
  assert float(sums["weight"]) == 2.0
  summary = losses.summarize(jax.device_get(sums))
  np.testing.assert_allclose(summary["nll"], np.log(5), rtol=1e-6)
  np.testing.assert_allclose(summary["perplexity"], 5.0, rtol=1e-5)


def test_correct_means_the_label_has_the_largest_logit():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(6, 7, 13)).astype(np.float32)
  labels = rng.integers(0, 13, (6, 7))
  labels[0] = logits[0].argmax(-1)  # some rows certainly right
  _, _, correct = token_losses(logits, labels, 0.1)
  np.testing.assert_array_equal(correct, (logits.argmax(-1) == labels).astype(np.float32))
  assert 0 < correct.mean() < 1


@pytest.mark.parametrize("eps, chunk_tokens, z_loss", [
    (0.1, 6, 0.0),  # 2 positions per chunk: 7 positions end in a padded chunk
    (0.0, 1, 0.0),  # at least one position per chunk
    (0.1, 1000, 0.0),  # one chunk holding everything
    (0.1, 6, 1e-3),  # with z-loss
])
def test_chunked_sums_and_gradients_equal_the_dense_ones(eps, chunk_tokens, z_loss):
  rng = np.random.default_rng(2)
  hidden = jnp.asarray(rng.normal(size=(3, 7, 8)), jnp.float32)  # [B, T, D]
  embedding = jnp.asarray(rng.normal(size=(11, 8)), jnp.float32)  # [V, D]
  labels = jnp.asarray(rng.integers(1, 11, (3, 7)))
  weights = jnp.asarray(np.arange(7) < np.array([[7], [4], [1]]))  # padded rows

  def dense(hidden, embedding):
    return losses.loss_sums(hidden @ embedding.T, labels, weights, eps, z_loss)

  def chunked(hidden, embedding):
    return losses.chunked_loss_sums(hidden, labels, weights, eps, lambda h: h @ embedding.T,
                                    chunk_tokens, z_loss)

  want, got = jax.jit(dense)(hidden, embedding), jax.jit(chunked)(hidden, embedding)
  for key in want:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=key)
  grads = [jax.jit(jax.grad(lambda h, e: f(h, e)["loss"], argnums=(0, 1)))(hidden, embedding)
           for f in (dense, chunked)]
  for want_grad, got_grad in zip(*grads):
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5, atol=1e-7)
  assert float(jnp.abs(grads[0][0][2, 1:]).max()) == 0.0  # padding gets no gradient


def test_z_loss_adds_the_squared_log_normaliser():
  """PaLM's auxiliary loss: z · log(Z)^2 per token, Z = sum_v exp(logit_v), in NumPy; the NLL
  (and so the perplexity) is the model's alone."""
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(2, 3, 9)).astype(np.float32) * 4 + 2
  labels = rng.integers(0, 9, (2, 3))
  plain, nll, _ = token_losses(logits, labels, 0.1)
  with_z, nll_z, _ = token_losses(logits, labels, 0.1, z_loss=1e-2)
  log_z = np.log(np.exp(np.asarray(logits, np.float64)).sum(-1))
  np.testing.assert_allclose(with_z, np.asarray(plain) + 1e-2 * log_z ** 2, rtol=1e-5)
  np.testing.assert_array_equal(nll_z, nll)
