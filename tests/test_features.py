import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from dwise_predict.errors import ConfigError, PredictorInputError
from dwise_predict.features import (
    COUNT_FEATURES,
    FEATURE_SETS,
    LEXICAL_FEATURES,
    PromptFeaturizer,
    check_feature_names,
    feature_row,
    feature_set,
    lexical_features,
    lexical_matrix,
    select_features,
)


@pytest.fixture
def byte_tokenizer():
    vocab = {chr(i): i for i in range(256)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="\x00"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return tok


def test_features_count_words_newlines_and_templated_tokens(byte_tokenizer):
    f = PromptFeaturizer(
        byte_tokenizer,
        "<u>{{ messages[0]['content'] }}</u>{% if add_generation_prompt %}<a>{% endif %}",
    )
    x = f(["hello world\nagain", "x"])
    assert x.shape == (2, 3)
    assert x[0, :2].tolist() == [3, 1]
    # one token per character: prompt + "<u>" + "</u>" + "<a>" = +10 characters
    assert x[:, 2].tolist() == [len("hello world\nagain") + 10, 1 + 10]


def test_lexical_features_count_digits_symbols_and_questions_per_mille():
    # "12+30=?" has 7 characters: 4 digits, 2 symbols (+ and =; ? is not a code symbol), 1 "?"
    assert lexical_features("12+30=?") == (round(4000 / 7), round(2000 / 7), 1)
    assert lexical_features("") == (0, 0, 0)
    assert lexical_features("plain words") == (0, 0, 0)
    code = "def f(x):\n    return x[0] * 2;"
    digits, symbols, questions = lexical_features(code)
    assert symbols == round(1000 * sum(c in "{}()[];=_<>+*/%" for c in code) / len(code))
    assert digits == round(1000 * 2 / len(code)) and questions == 0
    # every value is an integer: the ONNX export's float32 trees compare them exactly
    assert all(isinstance(v, int) for v in lexical_features("Why? 3.5% of 100 (or 7)?"))


def test_feature_sets_rows_and_matrices_agree(byte_tokenizer):
    names = FEATURE_SETS["counts+lexical"]
    assert names == COUNT_FEATURES + LEXICAL_FEATURES and FEATURE_SETS["counts"] == COUNT_FEATURES
    prompts = ["What is 12 + 30?", "Tell me a story\nabout a fox.", ""]
    f = PromptFeaturizer(byte_tokenizer)
    X = f(prompts, names)
    assert X.shape == (3, 6)
    for p, x in zip(prompts, X):  # the per-arrival row = the batch matrix's row
        assert feature_row(names, p, len(p)) == tuple(x)
    assert np.array_equal(f(prompts), X[:, :3])  # the paper's counts by default
    # any order a bundle records is served in that order
    order = ("question_marks", "prompt_tokens", "digit_permille")
    assert feature_row(order, "12 + 30?", 9) == (1.0, 9.0, float(round(4000 / 8)))
    counts = X[:, :3]
    assert np.array_equal(select_features(names, counts, lexical_matrix(prompts)), X)
    assert np.array_equal(select_features(COUNT_FEATURES, counts, None), counts)


def test_feature_names_and_redacted_prompts_are_checked():
    assert lexical_matrix(["a", None]) is None  # a redacted prompt
    with pytest.raises(PredictorInputError, match="redacted.*--admission-features counts"):
        select_features(FEATURE_SETS["counts+lexical"], np.zeros((2, 3)), None)
    with pytest.raises(PredictorInputError, match="unknown admission features.*upgrade"):
        check_feature_names(("word_count", "sentiment"))
    with pytest.raises(ConfigError, match="unknown admission feature set 'bag'.*counts"):
        feature_set("bag")


def test_user_text_unwraps_exactly_one_templated_prompt(byte_tokenizer):
    tpl = "<u>{{ messages[0]['content'] }}</u>{% if add_generation_prompt %}<a>{% endif %}"
    f = PromptFeaturizer(byte_tokenizer, tpl)
    raw = "two words\nand a newline"
    assert f.user_text(f.render(raw)) == raw
    assert f.user_text(f.render("")) == ""
    # text that is not one templated prompt is never cut
    for text in (raw, "<u>half a frame", "</u><a>", "<u>x</u>"):
        assert f.user_text(text) == text
    # the features of the unwrapped prompt are the raw prompt's, template words excluded
    assert f([f.user_text(f.render(raw))]).tolist() == f([raw]).tolist()
    # no template, or one that does not carry the prompt through unchanged: nothing removed
    assert PromptFeaturizer(byte_tokenizer).user_text("<u>x</u><a>") == "<u>x</u><a>"
    upper = PromptFeaturizer(byte_tokenizer, "<u>{{ messages[0]['content'] | upper }}</u>")
    assert upper.user_text("<u>X</u>") == "<u>X</u>"


def test_bad_inputs(byte_tokenizer):
    f = PromptFeaturizer(byte_tokenizer)
    assert f([]).shape == (0, 3)
    with pytest.raises(PredictorInputError, match="expected str"):
        f(["ok", None])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="invalid chat template"):
        PromptFeaturizer(byte_tokenizer, "{% if %}")
    assert np.isfinite(f(["a b"])).all()


def test_from_pretrained_reads_a_model_folders_tokenizer_and_template(tmp_path):
    from dwise_predict.zoo.tiny_bd.config import TinyBDConfig
    from dwise_predict.zoo.tiny_bd.io import save_pretrained
    from dwise_predict.zoo.tiny_bd.model import TinyBDModel

    folder = save_pretrained(
        TinyBDModel(TinyBDConfig(d_model=16, n_layers=1, n_heads=2, d_ff=16)), tmp_path / "m"
    )
    f = PromptFeaturizer.from_pretrained(folder)
    # byte-level: "<|user|>" "\n" prompt "\n" "<|assistant|>" "\n" = 2 specials + 3 newlines +
    # prompt bytes
    assert f(["héllo"])[0].tolist() == [1, 0, 2 + 3 + len("héllo".encode())]
    with pytest.raises(ConfigError, match="no tokenizer.json"):
        PromptFeaturizer.from_pretrained(tmp_path)
