"""Loading a model on a device and in a dtype: names checked before any weight is read, the
bundled loaders placed like any model (the devices themselves: tests/test_devices.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2LMHeadModel

from captum_attnflow.hf import load_pretrained, resolve_device, resolve_dtype
from captum_attnflow.models import load_agreement_lm, load_agreement_model
from captum_attnflow.models.language_model import ASSET_DIR
from captum_attnflow.models.tagger import load_chunk_tagger

NO_CUDA = not torch.cuda.is_available()


def test_dtype_names():
    assert resolve_dtype(None) == resolve_dtype("auto") == "auto"
    assert [resolve_dtype(name) for name in ("float32", "bfloat16", "float16")] == [torch.float32, torch.bfloat16, torch.float16]
    assert resolve_dtype(torch.bfloat16) is torch.bfloat16
    for bad in ("fp16", "half", torch.int8, 16):
        with pytest.raises(ValueError, match="unknown dtype .* use auto \\(the checkpoint's\\), float32, bfloat16, float16"):
            resolve_dtype(bad)


def test_load_places_and_types_the_model_and_checks_before_reading(tmp_path):
    model = load_pretrained(GPT2LMHeadModel, ASSET_DIR, device="cpu", dtype="bfloat16", local_files_only=True)
    assert (model.device, model.dtype, model.training) == (torch.device("cpu"), torch.bfloat16, False)
    reference = GPT2LMHeadModel.from_pretrained(ASSET_DIR)
    torch.testing.assert_close(model.lm_head.weight, reference.lm_head.weight.to(torch.bfloat16))
    assert load_pretrained(GPT2LMHeadModel, ASSET_DIR).dtype == torch.float32  # the checkpoint's
    missing = tmp_path / "nothing here"  # a bad option fails before from_pretrained looks at the path
    with pytest.raises(ValueError, match="both place the model: give one"):
        load_pretrained(GPT2LMHeadModel, missing, device="cpu", device_map="auto")
    with pytest.raises(ValueError, match="unknown device_map 'everywhere'"):
        load_pretrained(GPT2LMHeadModel, missing, device_map="everywhere")
    with pytest.raises(ValueError, match="unknown dtype"):
        load_pretrained(GPT2LMHeadModel, missing, dtype="float64")


def test_bundled_loaders_take_the_same_options():
    for loader in (load_agreement_model, load_agreement_lm, load_chunk_tagger):
        model, _ = loader(dtype="float16")
        assert (model.dtype, model.device) == (torch.float16, torch.device("cpu")), loader.__name__
        mapped, _ = loader(device_map="auto")  # accelerate's map: here everything on the one device there is
        assert mapped.device == resolve_device("auto"), loader.__name__
        with pytest.raises(ValueError, match="unknown device"):
            loader(device="gpu")


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device")
def test_bundled_model_on_cuda_in_bfloat16_predicts_as_on_cpu():
    model, tokenizer = load_agreement_model(device="auto", dtype="bfloat16")
    assert (model.device.type, model.dtype) == ("cuda", torch.bfloat16)
    reference, _ = load_agreement_model()
    ids = tokenizer(["the keys to the cabinet", "the key to the cabinets"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(ids.cuda()).logits.argmax(-1).cpu(), reference(ids).logits.argmax(-1))
