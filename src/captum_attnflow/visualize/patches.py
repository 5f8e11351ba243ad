"""Patch heatmaps of vision transformers over the image."""

from __future__ import annotations


import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

from captum_attnflow.visualize._layout import Scores, as_layers, figure_and_axes


def plot_patch_heatmap(
    scores: Scores,
    image: Tensor | np.ndarray | None = None,
    grid: tuple[int, int] | None = None,
    special_tokens: int = 1,
    ax: Axes | None = None,
    title: str | None = None,
    cmap: str = "inferno",
    alpha: float = 0.6,
) -> Figure:
    """A vision transformer's token scores as a heatmap over its patch grid, on the image.

    The attention methods give an image model one score per token, [CLS] and the patches in
    row-major order (``AttentionRollout(vit).attribute(pixel_values)[b]``); this drops the
    first ``special_tokens`` ([CLS]; 2 for DeiT's [CLS] and distillation tokens) and lays the
    rest out as the patch grid, stretched over the image when one is given.

    Args:
        scores: (n,) one example's scores over the model's tokens.
        image: optional, the example's pixels, (C, H, W) as fed to the model or (H, W, C) /
            (H, W) as an image array; shown beneath, rescaled to [0, 1].
        grid: (rows, columns) of patches; default a square grid.
        special_tokens: how many tokens before the patches to leave out.
        ax: draw into this axes; a new figure is made when None.
        title: the axes title.
        cmap: a matplotlib colormap name.
        alpha: opacity of the heatmap over the image.

    Returns:
        Figure: the figure holding ``ax``.

    Example::

        >>> import torch
        >>> from captum_attnflow.visualize import plot_patch_heatmap
        >>> scores = torch.rand(17)  # [CLS] + a 4 x 4 grid of patches
        >>> fig = plot_patch_heatmap(scores, image=torch.rand(3, 32, 32), title="rollout")
        >>> fig.axes[0].images[1].get_array().shape  # the patch grid over the image
        (4, 4)
    """
    values = as_layers(scores, "scores")
    if values.shape[0] != 1:
        raise ValueError(f"scores must be one example's (n,) scores over the tokens, got shape {values.shape}.")
    patches = values[0, special_tokens:]
    if grid is None:
        side = int(round(np.sqrt(patches.size)))
        grid = (side, side)
    if grid[0] * grid[1] != patches.size:
        raise ValueError(
            f"{patches.size} patch scores (n = {values.shape[1]} minus {special_tokens} special tokens) do not fill "
            f"a {grid[0]} x {grid[1]} grid; pass grid=(rows, columns) or the model's special_tokens."
        )
    figure, ax = figure_and_axes(ax, width=4.5, height=4.0)
    extent = None
    if image is not None:
        pixels = _as_image(image)
        extent = (0, pixels.shape[1], pixels.shape[0], 0)
        ax.imshow(pixels, cmap="gray" if pixels.ndim == 2 else None, extent=extent)
    heatmap = ax.imshow(
        patches.reshape(grid), cmap=cmap, alpha=alpha if image is not None else 1.0, extent=extent,
        interpolation="nearest",
    )
    figure.colorbar(heatmap, ax=ax, fraction=0.046, pad=0.03)
    ax.set_xticks([])
    ax.set_yticks([])
    if title is not None:
        ax.set_title(title)
    return figure


def _as_image(image: Tensor | np.ndarray) -> np.ndarray:
    """An image as an (H, W) or (H, W, C) float array in [0, 1]; (C, H, W) tensors are transposed."""
    if isinstance(image, Tensor):
        image = image.detach().cpu().float().numpy()
        if image.ndim == 3:
            image = image.transpose(1, 2, 0)
    pixels = np.asarray(image, dtype=float)
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[..., 0]
    if pixels.ndim not in (2, 3) or (pixels.ndim == 3 and pixels.shape[2] not in (3, 4)):
        raise ValueError(
            f"image must be (C, H, W) pixel values or an (H, W, C) / (H, W) array, got shape {np.shape(image)}."
        )
    low, high = pixels.min(), pixels.max()
    return (pixels - low) / (high - low) if high > low else np.zeros_like(pixels)
