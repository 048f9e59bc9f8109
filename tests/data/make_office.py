# Makes tests/data/handbook.docx and review.pptx (run from the repository root); written for these tests, no licence terms.
import docx
import pptx

d = docx.Document()
d.core_properties.title = "Reactor operations handbook"
d.add_paragraph("This handbook covers the Zorblax reactor.")
d.add_heading("Start-up procedure", level=1)
d.add_paragraph("Open the coolant valve before the control rods are raised. The start-up takes forty minutes.")
for n in range(1, 9):
    d.add_paragraph(
        f"Start-up check {n}: confirm gauge {n} reads within its green band, log the reading with the "
        f"time, and wait for the second operator to countersign entry {n} before going on."
    )
d.add_heading("Shutdown procedure", level=1)
d.add_paragraph("Insert every control rod, then close the coolant valve after the core cools below 80 degrees.")
for n in range(1, 9):
    d.add_paragraph(
        f"Shutdown step {n}: record the core temperature, the rod positions and the pump {n} current "
        f"in the shutdown log; a reading out of range stops the shutdown until a supervisor clears it."
    )
t = d.add_table(rows=2, cols=2)
for (row, col), text in {(0, 0): "Alarm", (0, 1): "Meaning", (1, 0): "A7", (1, 1): "Coolant pressure low"}.items():
    t.cell(row, col).text = text
d.save("tests/data/handbook.docx")
p = pptx.Presentation()
p.core_properties.title = "Quarterly review"
for title, body in [
    ("Quarterly review", "Results of the third quarter"),
    ("Revenue", "Revenue grew by twelve percent, led by the northern region."),
    ("Hiring", "We hired nine engineers; two more start in January."),
]:
    s = p.slides.add_slide(p.slide_layouts[1])
    s.shapes.title.text = title
    s.placeholders[1].text = body
p.save("tests/data/review.pptx")
