"""python -m pcops.models realscan (pcops.models.realscan): per-object results on real scans."""

import json

import pytest
import torch


def test_realscan_on_the_shared_kitti_frames(kitti_dir, tmp_path):
    pytest.importorskip("matplotlib")
    from pcops.models.pointpillars import PointPillars
    from pcops.models.realscan import evaluate_real_scans, print_report

    model = PointPillars.pretrained()
    rec = evaluate_real_scans(model, kitti_dir, out=tmp_path)
    labelled = sum(1 for line in open(kitti_dir / "label_2" / "000000.txt") if not line.startswith("DontCare"))
    assert sum(r["frame"] == "000000" for r in rec["objects"]) == labelled
    for r in rec["objects"]:
        assert 0.0 <= r["best_bev_iou"] <= 1.0 and r["points_in_box"] >= 0
        assert r["detected"] == bool(r["best_bev_iou"] >= 0.5 and (r["det_score"] or 0) >= 0.3)
    assert all(f["score"] >= 0.5 for f in rec["false_positives"])
    assert json.loads((tmp_path / "realscan.json").read_text())["objects"] == rec["objects"]
    assert (tmp_path / "000000_bev.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print_report(rec)
    # a stricter rule never detects more
    strict = evaluate_real_scans(model, kitti_dir, score=0.9, iou=0.9)
    assert sum(r["detected"] for r in strict["objects"]) <= sum(r["detected"] for r in rec["objects"])


def test_realscan_bad_folder(tmp_path):
    from pcops.models.realscan import evaluate_real_scans, in_camera_view

    model = torch.nn.Linear(1, 1)
    with pytest.raises(ValueError, match="no velodyne"):
        evaluate_real_scans(model, tmp_path)
    (tmp_path / "velodyne").mkdir()
    (tmp_path / "velodyne" / "000000.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="label_2"):
        evaluate_real_scans(model, tmp_path)
    assert in_camera_view(torch.zeros(0, 7), None).shape == (0,)
