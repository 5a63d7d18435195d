set terminal pngcairo size 900,560 noenhanced
set output 'e5-step.png'
set title 'E5: GPA against AdamW and single-worker DiLoCo'
set xlabel 'training step (inner steps)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'e5-step.dat' index 0 with linespoints title 'adamw', 'e5-step.dat' index 1 with linespoints title 'gpa', 'e5-step.dat' index 2 with linespoints title 'diloco-h30', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
